"""The executor tasks' writer: events spread over 30 day-partitions vs one, a declared sort
order's cost, and task memory.

    .venv/bin/python bench/writer.py [--records 500000] [--partitions 2]
        [--small-task 12500] [--large-task 250000] [--rounds 2] [--json .platform/bench/writer.json]

Starts its own embedded stack (Apache Kafka, a throw-away SQLite catalog, local Spark) and prints
ratios within this run (absolute rates on a shared machine are noise):

- ``spread_30d / one_partition``: records/s of the same events (bench.workloads) spread over
  30 day-partitions vs all on one day; local[2], one task per Kafka partition; the best of
  ``--rounds`` runs of each, alternating (the smoke test runs one).
- ``sorted / unsorted``: records/s of the one-day events into a table that declares a sort order
  (``customer_id``, 5,000 values in random order: each task sorts its rows) vs one that does not;
  best of ``--rounds``, alternating, on the same warm session.
- worker peak RSS at ``--large-task`` vs ``--small-task`` records per task (the Python
  workers of a fresh Spark session per measurement), local[1] and local[2].
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyiceberg.transforms import IdentityTransform  # noqa: E402

from bench.rss import PeakRss  # noqa: E402
from bench.workloads import (  # noqa: E402
    BROKER_STOP_S,
    ONE_PARTITION,
    SPREAD_30_DAYS,
    Workload,
    produce,
    spec_for,
)
from ingestion.pipeline.run import run_pipeline  # noqa: E402
from resources.embedded import EmbeddedBroker  # noqa: E402
from resources.iceberg import IcebergCatalogResource  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402
from resources.spark import SparkResource  # noqa: E402

ROUNDS = 2  # each workload runs this many times, alternating; the best rate counts
SORT_COLUMN = "customer_id"  # the declared sort order's column: 5,000 values, random order


def ingest(
    kafka: KafkaResource,
    catalog: Any,
    spark: Any,
    name: str,
    topic: str,
    per_task: int,
    sort_by: str | None = None,
) -> dict[str, Any]:
    """One run of a fresh pipeline (its own table, sorted by ``sort_by`` if given: created and
    given the order before the run) over the whole topic, on Spark."""
    spec = spec_for(name, topic, None).model_copy(
        update={"max_records_per_task": per_task, "in_process_max_records": 0}
    )
    if sort_by is not None:
        from ingestion.table.schema import load_or_create_table

        with load_or_create_table(catalog, spec).update_sort_order() as order:
            order.asc(sort_by, IdentityTransform())
    report = run_pipeline(spec, kafka.client_config(), catalog, spark, kafka.get_cluster_id())
    return {
        "records": report.records,
        "records_per_s": round(report.records_per_s),
        "files": report.files,
        "mb": round(report.bytes_written / 1e6, 1),
    }


def compare_partitioning(
    kafka: KafkaResource,
    catalog: Any,
    spark: Any,
    workloads: list[Workload],
    per_task: int,
    rounds: int = ROUNDS,
) -> dict[str, dict[str, Any]]:
    """Best-of-``rounds`` records/s of each workload on the warm session ``spark``."""
    ingest(kafka, catalog, spark, "warmup", "warmup", per_task)  # imports on the workers
    best: dict[str, dict[str, Any]] = {}
    for round_ in range(rounds):
        for workload in workloads:
            run = ingest(
                kafka, catalog, spark, f"{workload.name}_{round_}", workload.name, per_task
            )
            print(f"  {workload.name} round {round_}: {run}", flush=True)
            if run["records_per_s"] > best.get(workload.name, {}).get("records_per_s", 0):
                best[workload.name] = run
    return best


def compare_sort_order(
    kafka: KafkaResource, catalog: Any, spark: Any, topic: str, per_task: int, rounds: int = ROUNDS
) -> dict[str, dict[str, Any]]:
    """Best-of-``rounds`` records/s into an unsorted table and one sorted by ``customer_id``,
    on the warm session ``spark``."""
    ingest(kafka, catalog, spark, "sort_warmup", "warmup", per_task, SORT_COLUMN)
    best: dict[str, dict[str, Any]] = {}
    for round_ in range(rounds):
        for name, sort_by in (("unsorted", None), ("sorted", SORT_COLUMN)):
            run = ingest(kafka, catalog, spark, f"{name}_{round_}", topic, per_task, sort_by)
            print(f"  {name} round {round_}: {run}", flush=True)
            if run["records_per_s"] > best.get(name, {}).get("records_per_s", 0):
                best[name] = run
    return best


def measure_rss(
    kafka: KafkaResource, catalog: Any, topic: str, slots: int, per_task: int
) -> dict[str, Any]:
    """Worker peak RSS of one run at ``per_task`` records per task, on a fresh session."""
    resource = SparkResource(master=f"local[{slots}]")
    spark = resource.spark_session
    spark.range(8).collect()
    with PeakRss() as rss:
        run = ingest(kafka, catalog, spark, f"rss_k{slots}_{per_task}", topic, per_task)
    resource.stop_session()
    run.update(slots=slots, per_task=per_task, workers_rss_mb=rss.workers // 2**20)
    print(f"  rss local[{slots}] {per_task}/task: {run}", flush=True)
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--small-task", type=int, default=12_500)
    parser.add_argument("--large-task", type=int, default=250_000)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="runs of each workload")
    parser.add_argument("--json", default=str(ROOT / ".platform" / "bench" / "writer.json"))
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="bench-writer-"))
    workloads = [ONE_PARTITION, SPREAD_30_DAYS]
    figures: dict[str, Any] = {"records": args.records, "partitions": args.partitions}
    with EmbeddedBroker(log_path=state / "kafka.log", stop_timeout_s=BROKER_STOP_S) as broker:
        from confluent_kafka.admin import NewTopic

        kafka = KafkaResource(bootstrap_servers=broker.bootstrap_servers)
        topics = [w.name for w in workloads] + ["warmup"]
        admin = kafka.get_admin_client()
        for future in admin.create_topics(
            [NewTopic(t, args.partitions, 1) for t in topics]
        ).values():
            future.result(15)
        for workload in workloads:
            produce(kafka.client_config(), workload.name, args.records, args.partitions, workload)
        produce(kafka.client_config(), "warmup", min(args.records, 20_000), args.partitions)
        catalog = IcebergCatalogResource(state_dir=str(state)).load_catalog()
        resource = SparkResource(master="local[2]")  # one warm session for both comparisons
        spark = resource.spark_session
        spark.range(8).collect()
        figures["workloads"] = compare_partitioning(
            kafka, catalog, spark, workloads, args.large_task, args.rounds
        )
        figures["sort_order"] = compare_sort_order(
            kafka, catalog, spark, ONE_PARTITION.name, args.large_task, args.rounds
        )
        resource.stop_session()  # the RSS runs below measure fresh sessions
        figures["rss"] = [
            measure_rss(kafka, catalog, ONE_PARTITION.name, slots, per_task)
            for slots in (1, 2)
            for per_task in (args.small_task, args.large_task)
        ]
        gc.collect()  # close the Kafka clients while the broker is up: no reconnect noise
    print_figures(figures, workloads, args.small_task, args.large_task)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(figures, indent=2))
    print(f"figures written to {args.json}")
    return 0


def print_figures(
    figures: dict[str, Any], workloads: list[Workload], small: int, large: int
) -> None:
    """The workload rows (rate vs one_partition) and the RSS ratios."""
    base = figures["workloads"][ONE_PARTITION.name]["records_per_s"]
    print(f"\n{'workload':<16}{'records':>10}{'rec/s':>10}{'files':>7}{'/one_partition':>16}")
    for workload in workloads:
        row = figures["workloads"][workload.name]
        ratio = row["records_per_s"] / base
        print(
            f"{workload.name:<16}{row['records']:>10}{row['records_per_s']:>10}"
            f"{row['files']:>7}{ratio:>16.2f}"
        )
    sort = figures["sort_order"]
    unsorted = sort["unsorted"]["records_per_s"]
    print(f"\n{'sort order':<16}{'records':>10}{'rec/s':>10}{'files':>7}{'/unsorted':>16}")
    for name in ("unsorted", "sorted"):
        row = sort[name]
        print(
            f"{name:<16}{row['records']:>10}{row['records_per_s']:>10}{row['files']:>7}"
            f"{row['records_per_s'] / unsorted:>16.2f}"
        )
    print(f"\n{'workers peak RSS':<18}{f'{small}/task MB':>16}{f'{large}/task MB':>16}{'ratio':>8}")
    for slots in (1, 2):
        runs = {r["per_task"]: r["workers_rss_mb"] for r in figures["rss"] if r["slots"] == slots}
        ratio = runs[large] / max(runs[small], 1)
        print(f"{f'local[{slots}]':<18}{runs[small]:>16}{runs[large]:>16}{ratio:>8.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
