"""`make dev` end to end: the UI answers GraphQL, the demo topic fills, the Spark Connect server
every run attaches to listens, Ctrl-C leaves nothing."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest

from ingestion.topics import describe_topic
from resources.embedded import find_free_port
from resources.kafka import KafkaResource
from tests.support.dev_stack import descendants, graphql, is_running, start_dev_stack

pytestmark = pytest.mark.integration


def test_dev_stack_serves_ui_produces_and_stops_cleanly(tmp_path: Path) -> None:
    port = find_free_port()
    process = start_dev_stack(tmp_path, port)
    try:
        assert process.stdout is not None
        banner = "".join(process.stdout.readline() for _ in range(5))
        bootstrap = re.search(r"Kafka \(Tansu\):\s+(\S+)", banner)
        assert bootstrap, banner
        remote = re.search(r"Spark Connect:\s+sc://127.0.0.1:(\d+)", banner)
        assert remote, banner
        socket.create_connection(("127.0.0.1", int(remote[1])), 5).close()
        deadline = time.monotonic() + 180
        answer: dict[str, object] = {}
        while time.monotonic() < deadline and not answer:
            try:
                answer = graphql(port, "{ version assetNodes { assetKey { path } } }")
            except OSError:
                time.sleep(1)
        assert answer, f"no GraphQL answer within 180 s; log: {tmp_path}/logs/dagster.log"
        data = answer["data"]
        assert isinstance(data, dict)
        assert {"assetKey": {"path": ["kafka", "orders"]}} in data["assetNodes"]
        children = descendants(process.pid)
        assert len(children) >= 3  # broker, Spark Connect, dagster dev (webserver, daemon)

        kafka = KafkaResource(bootstrap_servers=bootstrap[1])
        consumer = kafka.get_consumer()
        try:
            admin = kafka.get_admin_client()
            first = sum(describe_topic(admin, consumer, "orders").end_offsets.values())
            time.sleep(2)
            second = sum(describe_topic(admin, consumer, "orders").end_offsets.values())
        finally:
            consumer.close()
        assert second > first > 0, "the demo producer is not writing to 'orders'"
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert "Stopped." in output
    leftovers = [pid for pid in children if is_running(pid)]
    assert not leftovers, f"processes left running after Ctrl-C: {leftovers}"
    with pytest.raises(ConnectionRefusedError):  # the Connect server is gone with its port
        socket.create_connection(("127.0.0.1", int(remote[1])), 2).close()
    assert (tmp_path / "dagster_home" / "dagster.yaml").exists()
    assert os.path.getsize(tmp_path / "logs" / "tansu.log") > 0
