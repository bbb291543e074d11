"""One command for the benchmark: produce, then limit / baseline / ours, freshness, memory.

    .venv/bin/python bench/run.py [--records 2000000] [--json .platform/bench/latest.json]
    .venv/bin/python bench/run.py --suite dirty [--records 1000000]  # bad records, spread
    .venv/bin/python bench/run.py --suite nested   # nested JSON, headers (nested.py); all: both
    .venv/bin/python bench/run.py --suite late-copies [--records 200000]  # R54's guard

``--sensor-interval`` (default 15 s, the lag sensor's ``minimum_interval_seconds``) is the
freshness loop's wait between ticks; the smoke test (tests/bench/test_run.py) shortens it to 1 s so
that a 5-second freshness window does not wait out two 15-second ticks. The figure then no
longer stands for the sensor's: keep the default for real measurements.

Everything runs against the embedded stack it starts (Apache Kafka, a throw-away SQLite catalog,
local Spark). Figures are ratios within this run; absolute times on shared machines are noise.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import TopicPartition  # noqa: E402

from bench.dirty import WORKLOADS, print_dirty_table, run_suite  # noqa: E402
from bench.freshness import measure_freshness  # noqa: E402
from bench.late_copies import print_late_copy_table, run_late_copy_suite  # noqa: E402
from bench.nested import profile_nested, run_nested_suite  # noqa: E402
from bench.rss import PeakRss  # noqa: E402
from bench.workloads import BROKER_STOP_S, baseline, limit, produce, spec_for  # noqa: E402
from ingestion.kafka.ranges import OffsetRange  # noqa: E402
from ingestion.pipeline.execute import build_task_specs, execute_locally  # noqa: E402
from ingestion.pipeline.hooks import NO_HOOKS  # noqa: E402
from ingestion.pipeline.plan import Plan  # noqa: E402
from ingestion.pipeline.run import run_pipeline  # noqa: E402
from ingestion.table.schema import load_or_create_table  # noqa: E402
from resources.embedded import EmbeddedBroker  # noqa: E402
from resources.iceberg import IcebergCatalogResource  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402
from resources.spark import SparkResource  # noqa: E402

PARTITIONS = 8


def run_ours(
    kafka: KafkaResource, catalog: Any, slots: int, sizes: list[int], topic: str
) -> list[dict[str, Any]]:
    spark_resource = SparkResource(master=f"local[{slots}]")
    spark = spark_resource.spark_session
    spark.range(8).collect()  # warm the JVM and the Python workers: measure the engine
    results = []
    for size in sizes:
        spec = spec_for(f"ours_k{slots}_{size}", topic, size)
        with PeakRss() as rss:
            report = run_pipeline(
                spec, kafka.client_config(), catalog, spark, kafka.get_cluster_id()
            )
        results.append(
            {
                "slots": slots,
                "records": report.records,
                "records_per_s": round(report.records_per_s),
                "seconds": round(report.timings_s["total"], 2),
                "files": report.files,
                "bytes": report.bytes_written,
                "driver_rss_mb": rss.driver // 2**20,
                "jvm_rss_mb": rss.jvm // 2**20,
                "workers_rss_mb": rss.workers // 2**20,
            }
        )
        print(f"  ours local[{slots}] {results[-1]}", flush=True)
    spark_resource.stop_session()
    return results


def profile_engine(kafka: KafkaResource, catalog: Any, topic: str, records: int) -> list[str]:
    """cProfile one in-process task over ``records`` offsets; return the top costs."""
    spec = spec_for("profiled", topic, records)
    table = load_or_create_table(catalog, spec)
    plan = Plan(
        pipeline=spec.name,
        group_id="profile",
        table=spec.table,
        table_uuid=str(table.metadata.table_uuid),
        base_snapshot_id=None,
        committed=None,
        cluster_id="c",
        topic_ids={topic: "t"},
        start={(topic, 0): 0},
        end={(topic, 0): records},
        tasks=(OffsetRange(topic, 0, 0, records),),
    )
    specs = build_task_specs(
        spec, plan, table, None, kafka.client_config(), dict(catalog.properties), NO_HOOKS, {}
    )
    profiler = cProfile.Profile()
    profiler.enable()
    execute_locally(specs)
    profiler.disable()
    stats = pstats.Stats(profiler).sort_stats("tottime")
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:8]  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    return [
        f"{fn[2]} ({Path(fn[0]).name}:{fn[1]}): {v[2]:.2f} s self, {v[2] / total:.0%}"
        for fn, v in rows
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    suites = ("main", "dirty", "nested", "all", "late-copies")
    parser.add_argument("--suite", choices=suites, default="main")
    parser.add_argument(
        "--records", type=int, help="default 2,000,000; dirty/nested: 1,000,000 each"
    )
    parser.add_argument(
        "--repeats", type=int, help="dirty/nested: runs per workload (3); late-copies: rounds (5)"
    )
    parser.add_argument("--freshness-seconds", type=int, default=90)
    parser.add_argument(
        "--sensor-interval", type=float, default=15.0, help="freshness: seconds between ticks"
    )
    parser.add_argument(
        "--uncopied", type=int, nargs="+", default=[1000, 100_000], help="late-copies: RPO tails"
    )
    parser.add_argument("--late-copies", type=int, help="late-copies: per run (default 0.1 %%)")
    parser.add_argument("--json", help="default .platform/bench/latest.json (dirty.json)")
    args = parser.parse_args()
    default_json = "latest.json" if args.suite == "main" else f"{args.suite}.json"
    json_path = Path(args.json or ROOT / ".platform" / "bench" / default_json)
    if args.suite == "late-copies":
        n = args.records or 200_000
        repeats = args.repeats or 5
        return run_late_copies(n, repeats, json_path, args.uncopied, args.late_copies)
    if args.suite != "main":  # dirty, nested or both: one table of ratios to clean
        return run_dirty(args.records or 1_000_000, args.repeats or 3, json_path, args.suite)
    n = args.records or 2_000_000
    sizes = sorted({min(100_000, n), min(1_000_000, n), n})
    state = Path(tempfile.mkdtemp(prefix="bench-"))
    figures: dict[str, Any] = {"records": n, "partitions": PARTITIONS, "started": time.time()}
    with EmbeddedBroker(log_path=state / "kafka.log", stop_timeout_s=BROKER_STOP_S) as broker:
        kafka = KafkaResource(bootstrap_servers=broker.bootstrap_servers)
        admin = kafka.get_admin_client()
        from confluent_kafka.admin import NewTopic

        for future in admin.create_topics([NewTopic("orders", PARTITIONS, 1)]).values():
            future.result(15)
        figures["produce_per_s"] = round(produce(kafka.client_config(), "orders", n, PARTITIONS))
        print(f"produce: {figures['produce_per_s']:,} rec/s", flush=True)
        consumer = kafka.get_consumer()
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition("orders", p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
        consumer.close()
        ranges = [OffsetRange("orders", p, 0, end) for p, end in ends.items()]
        catalog = IcebergCatalogResource(state_dir=str(state)).load_catalog()
        figures["limit_per_s"] = {k: round(limit(kafka.client_config(), ranges, k)) for k in (1, 2)}
        print(f"limit: {figures['limit_per_s']} rec/s", flush=True)
        base_table = load_or_create_table(catalog, spec_for("baseline", "orders", None))
        figures["baseline_per_s"] = round(baseline(kafka.client_config(), ranges, base_table))
        print(f"baseline: {figures['baseline_per_s']:,} rec/s", flush=True)
        figures["ours"] = [r for k in (1, 2) for r in run_ours(kafka, catalog, k, sizes, "orders")]
        figures["freshness"] = measure_freshness(
            kafka, catalog, state, args.freshness_seconds, interval_s=args.sensor_interval
        )
        print(f"freshness: {figures['freshness']}", flush=True)
        figures["profile_top"] = profile_engine(kafka, catalog, "orders", min(200_000, ends[0]))
        gc.collect()  # close the Kafka clients while the broker is up: no reconnect noise
    print_table(figures)
    write_figures(figures, json_path)
    return 0


def run_dirty(records: int, repeats: int, json_path: Path, suite: str = "dirty") -> int:
    """The dirty-data (bench/dirty.py) and nested (bench/nested.py) suites: every workload
    against clean, in one run and one table."""
    state = Path(tempfile.mkdtemp(prefix=f"bench-{suite}-"))
    profile: list[str] = []
    with EmbeddedBroker(log_path=state / "kafka.log", stop_timeout_s=BROKER_STOP_S) as broker:
        kafka = KafkaResource(bootstrap_servers=broker.bootstrap_servers)
        catalog = IcebergCatalogResource(state_dir=str(state)).load_catalog()
        results = []
        if suite in ("dirty", "all"):
            results += run_suite(kafka, catalog, records, WORKLOADS, repeats)
        if suite in ("nested", "all"):
            results += run_nested_suite(kafka, catalog, records, repeats)
            profile = profile_nested(kafka, catalog, "nested-1")
        gc.collect()  # close the Kafka clients while the broker is up: no reconnect noise
    ok = print_dirty_table(results)
    for line in profile:
        print(line)
    figures = {"records": records, "repeats": repeats, "started": time.time(), "dirty": results}
    write_figures(figures, json_path)
    return 0 if ok else 1


def run_late_copies(
    records: int, repeats: int, json_path: Path, uncopied: list[int], late: int | None
) -> int:
    """The late-copy guard suite (bench/late_copies.py) on two embedded brokers."""
    state = Path(tempfile.mkdtemp(prefix="bench-late-copies-"))
    with (
        EmbeddedBroker(
            state / "primary.log", name="primary_cluster", stop_timeout_s=BROKER_STOP_S
        ) as primary,
        EmbeddedBroker(state / "dr.log", name="dr_cluster", stop_timeout_s=BROKER_STOP_S) as dr,
    ):
        kafka = KafkaResource(
            bootstrap_servers=primary.bootstrap_servers,
            replicas={"dr": {"bootstrap.servers": dr.bootstrap_servers}},
        )
        iceberg = IcebergCatalogResource(state_dir=str(state))
        results = run_late_copy_suite(
            kafka, kafka.for_cluster("dr"), iceberg, records, repeats, uncopied, late
        )
        gc.collect()  # close the Kafka clients while the brokers are up
        stopping = threading.Thread(target=primary.stop)  # each waits out its stop timeout
        stopping.start()
        dr.stop()
        stopping.join()
    ok = print_late_copy_table(results)
    figures = {"records": records, "repeats": repeats, "started": time.time(), "cases": results}
    write_figures(figures, json_path)
    return 0 if ok else 1


def write_figures(figures: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2))
    print(f"figures written to {path}")


def print_table(figures: dict[str, Any]) -> None:
    limit_per_s, base = figures["limit_per_s"], figures["baseline_per_s"]
    print(
        f"\n{'run':<22}{'records':>10}{'rec/s':>10}{'/limit':>8}{'/base':>7}{'files':>7}"
        f"{'MB':>7}{'driverMB':>9}{'jvmMB':>7}{'wrkMB':>7}"
    )
    print(f"{'limit local[1]':<22}{figures['records']:>10}{limit_per_s[1]:>10}")
    print(f"{'limit local[2]':<22}{figures['records']:>10}{limit_per_s[2]:>10}")
    print(f"{'baseline (1 process)':<22}{figures['records']:>10}{base:>10}")
    for r in figures["ours"]:
        name, rate = f"ours local[{r['slots']}]", r["records_per_s"]
        print(
            f"{name:<22}{r['records']:>10}{rate:>10}{rate / limit_per_s[r['slots']]:>8.2f}"
            f"{rate / base:>7.2f}{r['files']:>7}{r['bytes'] / 1e6:>7.1f}"
            f"{r['driver_rss_mb']:>9}{r['jvm_rss_mb']:>7}{r['workers_rss_mb']:>7}"
        )
    f = figures["freshness"]
    print(
        f"\nfreshness produce->queryable: p50 {f['p50_s']} s, p95 {f['p95_s']} s, "
        f"max {f['max_s']} s ({f['records']} records at {f['rate_per_s']}/s, {f['runs']} runs)"
    )
    print("profile (self time, one in-process task):")
    for line in figures["profile_top"]:
        print(f"  {line}")


if __name__ == "__main__":
    raise SystemExit(main())
