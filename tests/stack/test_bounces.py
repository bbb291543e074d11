"""R37: hard bounces and pauses of the driver, an executor and the broker.

Runs may fail and are retried; the oracle then shows 0 duplicates and 0 missing records. The
crashes here are real: SIGKILL of the driver process or of a Spark Python worker, SIGSTOP of the
broker process, and SIGKILL of the broker followed by a restart on its storage.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException

from ingestion import exceptions
from ingestion.pipeline.hooks import FailureHooks
from ingestion.table.offsets import find_committed_state
from resources.embedded import EmbeddedBroker
from resources.iceberg import IcebergCatalogResource
from tests.support.brokers import wait_until_serving
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, NewPipeline, records

pytestmark = pytest.mark.integration
PROJECT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "point", ["after_plan", "before_catalog_call", "after_catalog_call", "before_mirror"]
)
def test_driver_killed_hard_then_rerun(
    point: str,
    harness: Harness,
    catalog_resource: IcebergCatalogResource,
    tmp_path: Path,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
) -> None:
    """SIGKILL of the driver before the commit, right after the catalog accepted it (the
    ambiguous outcome) and before the mirror: the next runs lose and duplicate nothing."""
    topic, spec = new_pipeline(f"killed_{point}", partitions=2, produce=300)
    config = tmp_path / "driver.json"
    config.write_text(
        json.dumps(
            {
                "spec": spec.model_dump(mode="json", by_alias=True),
                "point": point,
                "bootstrap_servers": harness.kafka.bootstrap_servers,
                "state_dir": catalog_resource.state_dir,
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.killed_driver", str(config)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-4000:]
    committed = point in ("after_catalog_call", "before_mirror")
    exists = harness.catalog.table_exists(spec.table)
    assert (exists and harness.table(spec).scan().to_arrow().num_rows == 300) is committed

    ledger_producer.produce(topic, records(50, first=300))
    report = harness.run(spec)
    assert report.records == (50 if committed else 350)
    harness.run(spec)
    harness.assert_exactly_once(spec, ledger)
    harness.assert_mirror_matches_table(spec)


def test_executor_killed_hard_task_is_retried(
    tmp_path: Path, harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """SIGKILL of the Python worker running a task after it wrote its files: Spark retries the
    task, one file set commits, the dead attempt's files stay unreferenced."""
    _, spec = new_pipeline("executor_killed", produce=300)
    marker = tmp_path / "killed"

    def kill_worker(point: str, **context: Any) -> None:
        if context.get("stage") == "written" and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)

    report = harness.run(spec, hooks=FailureHooks({"in_task": kill_worker}))
    assert marker.exists()
    assert int(marker.read_text()) != os.getpid()  # an executor process died, not the driver
    assert report.records == 300
    harness.assert_exactly_once(spec, ledger)


@contextmanager
def broker_paused_for(broker: EmbeddedBroker, seconds: float) -> Iterator[threading.Event]:
    """Resume the broker ``seconds`` after something SIGSTOPs it; always resume on exit."""
    pid = broker.pid
    assert pid is not None
    paused = threading.Event()
    stop = threading.Event()

    def state() -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    def watch() -> None:
        while not stop.is_set() and state() != "T":
            time.sleep(0.05)
        if not stop.is_set():
            paused.set()
            stop.wait(seconds)
        os.kill(pid, signal.SIGCONT)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield paused
    finally:
        stop.set()
        watcher.join(10)
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize(("pause_s", "read_timeout_s"), [(4.0, 60.0), (12.0, 3.0)])
def test_broker_paused_during_a_task(
    pause_s: float,
    read_timeout_s: float,
    tmp_path: Path,
    harness: Harness,
    broker: EmbeddedBroker,
    new_pipeline: NewPipeline,
    ledger: Ledger,
) -> None:
    """The broker freezes while a task reads. A short pause: the run completes. A pause longer
    than the read timeout: the run fails naming the range, nothing is committed, and a run
    after the broker is back ingests everything once."""
    _, spec = new_pipeline(
        f"paused_{int(pause_s)}", produce=300, read_timeout_seconds=read_timeout_s
    )
    marker, broker_pid = tmp_path / "paused", broker.pid

    def pause_broker(point: str, **context: Any) -> None:
        if context.get("stage") == "start" and not marker.exists():
            marker.write_text("paused")
            os.kill(int(broker_pid or 0), signal.SIGSTOP)

    hooks = FailureHooks({"in_task": pause_broker})
    with broker_paused_for(broker, pause_s) as paused:
        if pause_s < read_timeout_s:
            assert harness.run(spec, hooks=hooks).records == 300
        else:
            with pytest.raises(exceptions.IngestionError, match="no progress past offset 0"):
                harness.run(spec, hooks=hooks)
        assert paused.is_set()
    if pause_s >= read_timeout_s:
        assert not harness.catalog.table_exists(spec.table) or (
            find_committed_state(harness.table(spec), spec.consumer_group_id) is None
        )
        # Paused longer than broker.session.timeout.ms (9 s), the KRaft node fences itself on
        # resume and serves the topic again only once it is unfenced: wait for that, as an
        # operator would, before the next run.
        wait_until_serving(broker.bootstrap_servers)
        assert harness.run(spec).records == 300
    harness.assert_exactly_once(spec, ledger)
    harness.assert_mirror_matches_table(spec)


def test_broker_killed_and_restarted_during_a_run(
    tmp_path: Path, harness: Harness, ledger: Ledger
) -> None:
    """R37 with a real restart: the broker (its storage on disk) is SIGKILLed right after the
    plan and started again on the same port a few seconds later. The run either completes or
    fails with nothing committed; the runs after it lose and duplicate nothing."""
    from confluent_kafka.admin import NewTopic

    from resources.kafka import KafkaResource
    from tests.support.pipelines import make_spec

    own = EmbeddedBroker(tmp_path / "kafka.log", name="bounced", data_dir=tmp_path / "data")
    with own:
        kafka = KafkaResource(bootstrap_servers=own.bootstrap_servers)
        bounced = Harness(kafka, harness.catalog, harness.spark, own.cluster_id)
        topic = "bounced"
        admin = kafka.get_admin_client()  # kept: a collected client cancels its futures
        admin.create_topics([NewTopic(topic, 2)])[topic].result(timeout=30)
        LedgerProducer(kafka, ledger).produce(topic, records(300))
        spec = make_spec(topic, "bounced", read_timeout_seconds=60.0)
        restarted = threading.Event()

        def bounce(point: str, **context: Any) -> None:
            if restarted.is_set():
                return
            own.stop_signal = signal.SIGKILL
            own.stop()
            time.sleep(3)  # clients see the broker gone, then come back
            own.start()
            restarted.set()

        # Failing is allowed; committing twice or losing a record is not.
        with contextlib.suppress(exceptions.IngestionError, KafkaException):
            bounced.run(spec, hooks=FailureHooks({"after_plan": bounce}))
        assert restarted.is_set()
        LedgerProducer(kafka, ledger).produce(topic, records(50, first=300))
        while bounced.run(spec).committed:
            pass
        bounced.assert_exactly_once(spec, ledger)
