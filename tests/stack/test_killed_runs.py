"""Dagster runs SIGKILLed at random moments while the topic is live, on the real broker.

Each run is what a user starts: ``dagster job execute`` of the pipeline's ingest job, in its own
process, against the session's Kafka broker and catalog. A seeded random delay picks when the
whole process group (the run and anything it started) gets SIGKILL: during start-up, planning,
reading, the catalog commit or the mirror. A producer keeps writing meanwhile. Then clean runs
drain the topic, and the oracle, plus DuckDB reading the rows, finds every record once. A
``mode: upsert`` pipeline on a Debezium topic is killed the same way, and its table must equal
the source table's state (R57).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from ingestion.audit.oracle import audit_table
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import find_committed_state
from resources.iceberg import IcebergCatalogResource
from tests.support.dagster_runs import job_execute_setup
from tests.support.debezium import DebeziumTable, cdc_spec, expected, state_by_duckdb
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import CreateTopic, Harness, NewPipeline, records

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
KILLS = 5
SEED = 27


class KilledRuns:
    """``dagster job execute`` of one pipeline's ingest job, SIGKILLed at seeded random moments
    while ``produce_more`` keeps the topic live, then clean runs until the topic is drained."""

    def __init__(
        self,
        tmp_path: Path,
        harness: Harness,
        catalog_resource: IcebergCatalogResource,
        spec: PipelineSpec,
    ) -> None:
        self.tmp_path, self.harness, self.spec = tmp_path, harness, spec
        added, self.command = job_execute_setup(
            tmp_path, spec, harness.kafka.bootstrap_servers, catalog_resource.state_dir
        )
        self.env = {**os.environ, **added}

    def execute(self, kill_after_s: float | None, limit_s: float = 600) -> int:
        with (self.tmp_path / "runs.log").open("ab") as log:
            # Not the repository root: a running make dev's .env there would redirect it.
            run = subprocess.Popen(
                self.command,
                cwd=self.tmp_path,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                return run.wait(timeout=kill_after_s or limit_s)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                return run.wait(timeout=30)

    def kill_while_producing(self, produce_more: Callable[[], object]) -> None:
        """:data:`KILLS` runs, each killed after 3-9 s unless it ended first, while
        ``produce_more`` is called every half second; at least one must have been killed."""
        producing = threading.Event()
        producing.set()

        def produce() -> None:
            while producing.is_set():
                produce_more()
                time.sleep(0.5)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        chance = random.Random(SEED)
        try:
            killed = 0
            for _ in range(KILLS):
                if self.execute(chance.uniform(3.0, 9.0)) == -signal.SIGKILL:
                    killed += 1
        finally:
            producing.clear()
            producer.join(30)
        # A run that ended before its kill is fine (a fast machine); none killed proves nothing.
        assert killed >= 1, f"none of {KILLS} runs was killed before it ended"

    def drain(self, topic: str, ledger: Ledger) -> None:
        """Clean runs (each capped by the spec) until the table's offsets reach the ledger's."""
        ends: dict[int, int] = {}
        for entry in ledger.entries:
            ends[entry.partition] = max(ends.get(entry.partition, 0), entry.offset + 1)
        for _ in range(10):
            code = self.execute(None)
            assert code == 0, (code, (self.tmp_path / "runs.log").read_text()[-4000:])
            table = self.harness.table(self.spec)
            committed = find_committed_state(table, self.spec.consumer_group_id)
            if committed and committed.offsets[topic].next_offsets == ends:
                return
        raise AssertionError(f"10 clean runs did not drain {topic}")


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
    runs = KilledRuns(tmp_path, harness, catalog_resource, spec)
    live = LedgerProducer(harness.kafka, ledger)
    first = [300]

    def produce_more() -> None:
        live.produce(topic, records(10, first=first[0]))
        first[0] += 10

    runs.kill_while_producing(produce_more)
    runs.drain(topic, ledger)
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


def test_upsert_runs_killed_at_random_leave_the_source_state(
    tmp_path: Path,
    harness: Harness,
    catalog_resource: IcebergCatalogResource,
    create_topic: CreateTopic,
    ledger: Ledger,
) -> None:
    """R57's oracle for state: a Debezium topic (a snapshot, then inserts, updates and
    deletes with tombstones, a tenth of the keys taking half of the changes) ingested by
    ``mode: upsert`` runs SIGKILLed at random; after clean runs DuckDB reads exactly the
    source's rows from the table's live files, and the production audit passes every commit."""
    source = DebeziumTable(partitions=3)
    topic = create_topic(partitions=3)
    spec = cdc_spec(
        topic,
        "killed_upserts",
        max_records_per_run=600,
        max_records_per_task=150,
        in_process_max_records=1_000,
    )
    live = LedgerProducer(harness.kafka, ledger)
    live.produce(topic, source.snapshot(300))
    rng = random.Random(SEED)
    runs = KilledRuns(tmp_path, harness, catalog_resource, spec)
    runs.kill_while_producing(lambda: live.produce(topic, source.random_changes(rng, 15, 400)))
    runs.drain(topic, ledger)
    assert state_by_duckdb(harness.table(spec)) == expected(source)
    harness.assert_commits_audited(spec)
    assert audit_table(harness.table(spec), spec.consumer_group_id).ok
