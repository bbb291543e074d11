"""``mode: upsert`` (R57): its throughput against append of the same records, and the table
after many small commits with and without maintenance.

    .venv/bin/python bench/upsert.py [--keys 50000] [--changes 150000] [--cap 30000]
        [--commits 1000] [--per-commit 20] [--maintain-every 100]
        [--json .platform/bench/upsert.json]

Starts its own embedded stack (Apache Kafka, a throw-away SQLite catalog, local[2] Spark). The
records are a Debezium topic in the flattened form (``ExtractNewRecordState``: the row with
``__op``, ``__deleted``, ``__source_ts_ms``, ``__lsn``; tests/support/debezium.py), JSON without
schemas, 2 partitions: a snapshot of ``--keys`` rows, then ``--changes`` inserts, updates and
deletes where a tenth of the keys take half of the changes. Prints ratios within this run:

- ``upsert / append``: records/s of the change phase (after both tables hold the snapshot),
  in runs of at most ``--cap`` records on Spark: the append pipeline stores every record as a
  row (its schema declares the ``__`` fields), the upsert pipeline replaces the rows of the
  changed keys by copy-on-write. Both partitioned by ``bucket[4](name)``.
- after ``--commits`` runs of ``--per-commit`` changes each (in the run process: a trickle), a
  table left alone against one maintained every ``--maintain-every`` commits
  (``ingestion.ops.maintenance.maintain_table``: compaction, then expiry of snapshots older
  than the run): live data files, snapshots, and the best of 3 full reads by pyiceberg and by
  DuckDB (its files).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.workloads import BROKER_STOP_S  # noqa: E402
from ingestion.ops.maintenance import maintain_table  # noqa: E402
from ingestion.pipeline.run import RunReport, run_pipeline  # noqa: E402
from ingestion.spec.pipeline import PipelineSpec, parse_pipeline_spec  # noqa: E402
from resources.embedded import EmbeddedBroker  # noqa: E402
from resources.iceberg import IcebergCatalogResource  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402
from resources.spark import SparkResource  # noqa: E402
from tests.support.debezium import (  # noqa: E402
    DebeziumTable,
    Record,
    cdc_spec,
    expected,
    state_by_duckdb,
)

SEED = 31
FLAT_FIELDS = [  # what the append pipeline declares besides the row's columns
    {"name": "__op", "type": "string"},
    {"name": "__deleted", "type": "string"},
    {"name": "__source_ts_ms", "type": "long"},
    {"name": "__lsn", "type": "long"},
]


def produce(kafka: KafkaResource, topic: str, events: list[Record]) -> None:
    """Produce ``events`` (key, value, partition) and wait for every acknowledgement."""
    producer = kafka.get_producer()
    for key, value, partition in events:
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition or 0)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


def create_topic(kafka: KafkaResource, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import NewTopic

    admin = kafka.get_admin_client()
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(15)


def renamed(spec: PipelineSpec, name: str, **changes: Any) -> PipelineSpec:
    """``spec`` as pipeline ``name`` with its own table and group, and ``changes``."""
    raw = spec.model_dump(mode="json", by_alias=True)
    raw.update(
        name=name,
        table=f"bench.{name}",
        quarantine_table=f"bench.{name}_quarantine",
        consumer_group_id=f"bench-{name}",
        **changes,
    )
    return parse_pipeline_spec(raw)


def specs(topic: str, prefix: str, **overrides: Any) -> tuple[PipelineSpec, PipelineSpec]:
    """The upsert pipeline and the append pipeline of the same records."""
    upsert = renamed(cdc_spec(topic, "x", envelope="flattened", **overrides), f"{prefix}_upsert")
    schema = [f.model_dump(by_alias=True) for f in upsert.schema_fields or []] + FLAT_FIELDS
    append = renamed(upsert, f"{prefix}_append", mode="append", key_fields=None, schema=schema)
    return upsert, append


def drain(
    spec: PipelineSpec, kafka: KafkaResource, catalog: Any, spark: Any
) -> tuple[int, float, list[RunReport]]:
    """Runs until the topic is drained: (records, seconds, reports)."""
    records, seconds, reports = 0, 0.0, list[RunReport]()
    while True:
        report = run_pipeline(spec, kafka.client_config(), catalog, spark, kafka.get_cluster_id())
        if not report.committed:
            return records, seconds, reports
        records += report.records
        seconds += report.timings_s["total"]
        reports.append(report)


def throughput(
    kafka: KafkaResource, catalog: Any, keys: int, changes: int, cap: int
) -> dict[str, Any]:
    """Records/s of the change phase, upsert vs append (see the module docstring)."""
    source = DebeziumTable(partitions=2, flattened=True, schemas_enabled=False)
    topic = "cdc_throughput"
    create_topic(kafka, topic, 2)
    upsert, append = specs(
        topic, "tp", max_records_per_run=cap, max_records_per_task=cap, in_process_max_records=0
    )
    resource = SparkResource(master="local[2]")
    spark = resource.spark_session
    spark.range(8).collect()
    produce(kafka, topic, source.snapshot(keys))
    for spec in (append, upsert):  # the snapshot phase, not timed (warms the workers too)
        drain(spec, kafka, catalog, spark)
    produce(kafka, topic, source.random_changes(random.Random(SEED), changes, keys))
    figures: dict[str, Any] = {}
    for spec in (append, upsert):
        records, seconds, reports = drain(spec, kafka, catalog, spark)
        table = catalog.load_table(spec.table)
        figures[spec.mode] = {
            "records": records,
            "runs": len(reports),
            "records_per_s": round(records / seconds) if seconds else 0,
            "rows": table.scan().to_arrow().num_rows,
            "rewritten_files": sum(r.rewritten_files for r in reports),
            "inserts": sum(r.inserts for r in reports),
            "updates": sum(r.updates for r in reports),
            "deletes": sum(r.deletes for r in reports),
        }
        print(f"  {spec.mode}: {figures[spec.mode]}", flush=True)
    resource.stop_session()
    upserted = catalog.load_table(upsert.table)
    assert state_by_duckdb(upserted) == expected(source), "the upsert table is not the source"
    return figures


def read_figures(table: Any) -> dict[str, Any]:
    """Live data files, snapshots, and the best of 3 full reads by pyiceberg and DuckDB."""
    import duckdb

    table.refresh()
    tasks = list(table.scan().plan_files())
    files = [urlparse(t.file.file_path).path for t in tasks]
    best_py, best_duck = float("inf"), float("inf")
    for _ in range(3):
        started = time.perf_counter()
        rows = table.scan().to_arrow().num_rows
        best_py = min(best_py, time.perf_counter() - started)
        started = time.perf_counter()
        with duckdb.connect() as connection:
            found = connection.execute("select count(*) from read_parquet(?)", [files]).fetchone()
        best_duck = min(best_duck, time.perf_counter() - started)
        assert found is not None
        assert found[0] == rows
    return {
        "rows": rows,
        "data_files": len(files),
        "snapshots": len(table.metadata.snapshots),
        "read_pyiceberg_s": round(best_py, 3),
        "read_duckdb_s": round(best_duck, 3),
    }


def many_commits(
    kafka: KafkaResource, catalog: Any, commits: int, per_commit: int, every: int
) -> dict[str, Any]:
    """``commits`` small upsert runs into two tables, one maintained every ``every`` commits."""
    source = DebeziumTable(partitions=1, flattened=True, schemas_enabled=False)
    topic = "cdc_commits"
    create_topic(kafka, topic, 1)
    keys = 20 * per_commit * 5
    produce(kafka, topic, source.snapshot(keys))
    plain, _ = specs(topic, "many", in_process_max_records=1_000_000)
    maintained = renamed(plain, "kept")
    rng = random.Random(SEED)
    started = time.monotonic()
    seconds = {plain.name: 0.0, maintained.name: 0.0}
    maintenance_s = 0.0
    for commit in range(commits):
        produce(kafka, topic, source.random_changes(rng, per_commit, keys))
        for spec in (plain, maintained):
            report = run_pipeline(
                spec, kafka.client_config(), catalog, None, kafka.get_cluster_id()
            )
            seconds[spec.name] += report.timings_s["total"]
        if (commit + 1) % every == 0:
            began = time.monotonic()
            maintain_table(
                catalog.load_table(maintained.table),
                snapshot_retention_s=1.0,
                orphan_window_s=24 * 3600.0,
                group_id=maintained.consumer_group_id,
            )
            maintenance_s += time.monotonic() - began
            print(
                f"  {commit + 1} commits, {time.monotonic() - started:.0f} s; "
                f"per run: plain {seconds[plain.name] / (commit + 1):.2f} s, "
                f"maintained {seconds['kept'] / (commit + 1):.2f} s",
                flush=True,
            )
    figures: dict[str, Any] = {
        "commits": commits,
        "per_commit": per_commit,
        "keys": keys,
        "maintain_every": every,
        "maintenance_s": round(maintenance_s, 1),
        "run_s_plain": round(seconds[plain.name] / commits, 3),
        "run_s_maintained": round(seconds["kept"] / commits, 3),
    }
    for label, spec in (("plain", plain), ("kept", maintained)):
        table = catalog.load_table(spec.table)
        assert state_by_duckdb(table) == expected(source), f"{spec.name} is not the source"
        figures[label] = read_figures(table)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--changes", type=int, default=150_000)
    parser.add_argument("--cap", type=int, default=30_000, help="records per run")
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--per-commit", type=int, default=20)
    parser.add_argument("--maintain-every", type=int, default=100)
    parser.add_argument("--json", default=str(ROOT / ".platform" / "bench" / "upsert.json"))
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="bench-upsert-"))
    figures: dict[str, Any] = {}
    with EmbeddedBroker(log_path=state / "kafka.log", stop_timeout_s=BROKER_STOP_S) as broker:
        kafka = KafkaResource(bootstrap_servers=broker.bootstrap_servers)
        catalog = IcebergCatalogResource(state_dir=str(state)).load_catalog()
        figures["throughput"] = throughput(kafka, catalog, args.keys, args.changes, args.cap)
        figures["commits"] = many_commits(
            kafka, catalog, args.commits, args.per_commit, args.maintain_every
        )
    print_figures(figures)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(figures, indent=2))
    print(f"figures written to {args.json}")
    return 0


def print_figures(figures: dict[str, Any]) -> None:
    """The throughput rows (rate vs append) and the two tables after the commits."""
    rows = figures["throughput"]
    base = rows["append"]["records_per_s"]
    print(f"\n{'change phase':<14}{'records':>10}{'runs':>6}{'rec/s':>10}{'/append':>10}")
    for mode in ("append", "upsert"):
        row = rows[mode]
        ratio = row["records_per_s"] / base if base else 0.0
        print(
            f"{mode:<14}{row['records']:>10}{row['runs']:>6}{row['records_per_s']:>10}"
            f"{ratio:>10.2f}"
        )
    commits = figures["commits"]
    print(
        f"\nafter {commits['commits']} commits of {commits['per_commit']} changes "
        f"({commits['keys']} keys; maintenance every {commits['maintain_every']})"
    )
    print(
        f"{'table':<12}{'rows':>8}{'files':>8}{'snapshots':>11}{'pyiceberg s':>13}{'duckdb s':>10}"
    )
    for name in ("plain", "kept"):
        row = commits[name]
        print(
            f"{name:<12}{row['rows']:>8}{row['data_files']:>8}{row['snapshots']:>11}"
            f"{row['read_pyiceberg_s']:>13}{row['read_duckdb_s']:>10}"
        )
    print(
        f"run time per commit: plain {commits['run_s_plain']} s, maintained "
        f"{commits['run_s_maintained']} s; maintenance {commits['maintenance_s']} s in all"
    )


if __name__ == "__main__":
    raise SystemExit(main())
