"""Dagster runs SIGKILLed at random moments while the topic is live, on the real broker.

Each run is what a user starts: ``dagster job execute`` of the pipeline's ingest job, in its own
process, against the session's Kafka broker and catalog. A seeded random delay picks when the
whole process group (the run and anything it started) gets SIGKILL: during start-up, planning,
reading, the catalog commit or the mirror. A producer keeps writing meanwhile. Then clean runs
drain the topic, and the oracle, plus DuckDB reading the rows, finds every record once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import duckdb
import pytest

from ingestion.table.offsets import find_committed_state
from resources.iceberg import IcebergCatalogResource
from tests.support.dagster_runs import job_execute_setup
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, NewPipeline, records

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
KILLS = 5
SEED = 27


def test_runs_killed_at_random_lose_and_duplicate_nothing(
    tmp_path: Path,
    harness: Harness,
    catalog_resource: IcebergCatalogResource,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
) -> None:
    topic, spec = new_pipeline(
        "killed_runs",
        partitions=3,
        produce=300,
        max_records_per_run=600,
        max_records_per_task=100,
        in_process_max_records=1_000,  # runs read in their own process: no Spark JVM per run
    )  # (SIGKILLed Spark executors: tests/stack/test_bounces.py)
    added, command = job_execute_setup(
        tmp_path, spec, harness.kafka.bootstrap_servers, catalog_resource.state_dir
    )
    env = {**os.environ, **added}

    def execute(kill_after_s: float | None, limit_s: float = 600) -> int:
        with (tmp_path / "runs.log").open("ab") as log:
            run = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                return run.wait(timeout=kill_after_s or limit_s)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                return run.wait(timeout=30)

    producing = threading.Event()
    producing.set()
    live = LedgerProducer(harness.kafka, ledger)

    def produce() -> None:
        first = 300
        while producing.is_set():
            live.produce(topic, records(10, first=first))
            first += 10
            time.sleep(0.5)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    chance = random.Random(SEED)
    try:
        killed = 0
        for _ in range(KILLS):
            if execute(chance.uniform(3.0, 9.0)) == -signal.SIGKILL:
                killed += 1
    finally:
        producing.clear()
        producer.join(30)
    # A run that ended before its kill is fine (a fast machine); none killed proves nothing.
    assert killed >= 1, f"none of {KILLS} runs was killed before it ended"

    ends: dict[int, int] = {}
    for entry in ledger.entries:
        ends[entry.partition] = max(ends.get(entry.partition, 0), entry.offset + 1)
    for _ in range(10):  # clean runs (capped at 600 records each) until the topic is drained
        code = execute(None)
        assert code == 0, (code, (tmp_path / "runs.log").read_text()[-4000:])
        committed = find_committed_state(harness.table(spec), spec.consumer_group_id)
        if committed and committed.offsets[topic].next_offsets == ends:
            break
    harness.assert_exactly_once(spec, ledger)
    harness.assert_mirror_matches_table(spec)
    scan = harness.table(spec).scan(selected_fields=("_kafka_partition", "_kafka_offset"))
    rows = scan.to_arrow()
    assert rows is not None
    relation = duckdb.sql(
        "select count(*), count(distinct (_kafka_partition, _kafka_offset)) from rows"
    )
    assert relation is not None
    distinct = relation.fetchall()[0]
    assert distinct == (len(ledger.committed(topic)), len(ledger.committed(topic)))
