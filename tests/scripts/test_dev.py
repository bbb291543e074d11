"""`make dev` end to end: the UI answers GraphQL, the demo topic fills, the Spark Connect server
every run attaches to listens, Ctrl-C leaves nothing.

The stack is the session's shared one (tests/support/dev_stack.py): this test runs last among
its users and stops it.
"""

from __future__ import annotations

import os
import re
import socket
import time

import pytest

from ingestion.kafka.topics import describe_topic
from resources.kafka import KafkaResource
from tests.support.dev_stack import DevStack, graphql, is_running

pytestmark = pytest.mark.integration


def test_dev_stack_serves_ui_produces_and_stops_cleanly(dev_stack: DevStack) -> None:
    try:
        banner = dev_stack.banner
        bootstrap = re.search(r"Kafka \(Tansu\):\s+(\S+)", banner)
        assert bootstrap, banner
        remote = re.search(r"Spark Connect:\s+sc://127.0.0.1:(\d+)", banner)
        assert remote, banner
        socket.create_connection(("127.0.0.1", int(remote[1])), 5).close()
        answer = graphql(dev_stack.port, "{ version assetNodes { assetKey { path } } }")
        data = answer["data"]
        assert isinstance(data, dict)
        assert {"assetKey": {"path": ["kafka", "orders"]}} in data["assetNodes"]
        children = dev_stack.children  # once the UI answered
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
        output = dev_stack.stop()  # Ctrl-C
    assert dev_stack.process.returncode == 0, output
    assert "Stopped." in output
    leftovers = [pid for pid in children if is_running(pid)]
    assert not leftovers, f"processes left running after Ctrl-C: {leftovers}"
    with pytest.raises(ConnectionRefusedError):  # the Connect server is gone with its port
        socket.create_connection(("127.0.0.1", int(remote[1])), 2).close()
    state = dev_stack.state_dir
    assert (state / "dagster_home" / "dagster.yaml").exists()
    assert os.path.getsize(state / "logs" / "tansu.log") > 0
