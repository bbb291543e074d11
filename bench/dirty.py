"""The data-shape suite: clean order events against bad records at 0.1 %, 1 % and 10 % (four
kinds), and events spread over 30 day-partitions against all on one day.

    .venv/bin/python bench/run.py --suite dirty [--records 1000000] [--repeats 3] [--json PATH]

Each workload is produced to its own topic on the embedded broker and ingested by the engine
(``run_pipeline``, local Spark) at the same parallelism, in one Spark session, in ``--repeats``
rounds of every workload (a fresh table and group each time; the median is shown).
Throughput counts every offset consumed (rows landed + rows quarantined); the table prints
each workload's ratio to the faster clean run (the spread row: to the one-day row) and its
target (``SLOW`` when missed). Each row checks its counts, read back from the tables: every
good record landed once, every bad one quarantined once. The exit status is 1 only when a
count is wrong. Add a row by adding a :class:`Workload` to ``WORKLOADS``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.workloads import ONE_PARTITION, SPREAD_30_DAYS, KafkaRecord, produce, spec_for
from platform_assets.demo import encode_event, make_order_event

PARTITIONS = 6
SLOTS = 2
Corrupt = Callable[[bytes, dict[str, Any]], KafkaRecord]
"""(key, event) -> the bad record that replaces it."""


@dataclass(frozen=True)
class Workload:
    """A topic of order events where a share ``rate`` of the records is replaced by ``corrupt``.

    ``target``: the lowest acceptable throughput relative to ``versus`` (the name of another
    row; "clean": the faster clean run; None: shown only). ``event``: the event maker (default
    the demo's). ``overrides``: changes to the bench pipeline spec (the ``orders`` pipeline).
    """

    name: str
    rate: float = 0.0
    corrupt: Corrupt | None = None
    target: float | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    event: Callable[[random.Random, int], dict[str, Any]] = make_order_event
    versus: str = "clean"

    def maker(self, counter: list[int]) -> Callable[[random.Random, int], KafkaRecord]:
        """The record maker for ``produce``; counts the bad records made in ``counter[0]``."""
        choose = random.Random(f"{self.name}-bad")

        def make(rng: random.Random, sequence: int) -> KafkaRecord:
            event = self.event(rng, sequence)
            key = event["order_id"].encode()
            if self.corrupt is not None and choose.random() < self.rate:
                counter[0] += 1
                return self.corrupt(key, event)
            return key, encode_event(event)

        return make


def truncated(key: bytes, event: dict[str, Any]) -> KafkaRecord:
    """Malformed JSON: the value cut in half (what a broken producer or a bad proxy sends)."""
    value = encode_event(event)
    return key, value[: len(value) // 2]


def tombstone(key: bytes, event: dict[str, Any]) -> KafkaRecord:
    return key, None


def bad_key(key: bytes, event: dict[str, Any]) -> KafkaRecord:
    """A key that is not UTF-8 (the pipeline has ``key_format: string``)."""
    return b"\xff" + key, encode_event(event)


def missing_required(key: bytes, event: dict[str, Any]) -> KafkaRecord:
    """No ``order_id`` (a required column)."""
    return key, encode_event({k: v for k, v in event.items() if k != "order_id"})


TARGETS = {0.001: 0.8, 0.01: 0.8, 0.1: 0.5}
"""Lowest throughput relative to clean at each rate of bad records."""
KINDS: list[tuple[str, Corrupt]] = [
    ("malformed", truncated),
    ("tombstone", tombstone),
    ("bad key", bad_key),
    ("missing required", missing_required),
]
WORKLOADS: list[Workload] = [
    Workload("clean"),
    *(
        Workload(f"{kind} {rate:.1%}", rate, corrupt, TARGETS[rate])
        for kind, corrupt in KINDS
        for rate in TARGETS
    ),
    Workload("one day", event=ONE_PARTITION.event),
    Workload("spread 30 days", event=SPREAD_30_DAYS.event, target=0.7, versus="one day"),
    Workload("clean (repeat)"),  # drift over the run; the ratios use the faster clean run
]


def count_landed(catalog: Any, table: str, quarantine: str) -> tuple[int, int, bool]:
    """Rows in the table and its quarantine table, read back, and whether every Kafka offset
    is in exactly one of them once (nothing twice, nothing in both)."""
    coordinates = ["_kafka_partition", "_kafka_offset"]
    rows = catalog.load_table(table).scan(selected_fields=tuple(coordinates)).to_arrow()
    bad = catalog.load_table(quarantine).scan(selected_fields=tuple(coordinates)).to_arrow()
    seen = set(zip(*(rows.column(c).to_pylist() for c in coordinates), strict=True))
    seen_bad = set(zip(*(bad.column(c).to_pylist() for c in coordinates), strict=True))
    once = len(seen) == rows.num_rows and len(seen_bad) == bad.num_rows and not seen & seen_bad
    return rows.num_rows, bad.num_rows, once


def run_suite(
    kafka: Any, catalog: Any, records: int, workloads: list[Workload], repeats: int = 3
) -> list[dict]:
    """Produce and ingest every workload in turn; return one result per workload."""
    from confluent_kafka.admin import NewTopic

    from ingestion.pipeline.run import run_pipeline
    from resources.spark import SparkResource

    topics = [f"dirty-{i}" for i in range(len(workloads))]
    admin = kafka.get_admin_client()
    new_topics = [NewTopic(t, PARTITIONS, 1) for t in ["dirty-warm-up", *topics]]
    for future in admin.create_topics(new_topics).values():
        future.result(15)
    produce(kafka.client_config(), "dirty-warm-up", min(records, 20_000), PARTITIONS)
    bad_counts = []
    for workload, topic in zip(workloads, topics, strict=True):
        counter = [0]
        rate = produce(
            kafka.client_config(), topic, records, PARTITIONS, make=workload.maker(counter)
        )
        bad_counts.append(counter[0])
        print(f"produced {workload.name}: {records:,} at {rate:,.0f} rec/s", flush=True)
    spark_resource = SparkResource(master=f"local[{SLOTS}]")
    spark = spark_resource.spark_session
    warm_up = spec_for("dirty_warm_up", "dirty-warm-up", None)  # JVM, workers, imports: not timed
    run_pipeline(warm_up, kafka.client_config(), catalog, spark, kafka.get_cluster_id())
    # Rounds: every workload once per round, so drift over the run (a shared machine, a
    # warming JVM) weighs on every workload alike.
    all_runs: list[list[Any]] = [[] for _ in workloads]
    for repeat in range(repeats):
        for index, (workload, topic) in enumerate(zip(workloads, topics, strict=True)):
            spec = spec_for(f"dirty_{index}_{repeat}", topic, None)
            spec = spec.model_copy(update=workload.overrides)
            all_runs[index].append(
                run_pipeline(spec, kafka.client_config(), catalog, spark, kafka.get_cluster_id())
            )
    results = []
    for index, (workload, topic, bad) in enumerate(zip(workloads, topics, bad_counts, strict=True)):
        runs = all_runs[index]
        report = sorted(runs, key=lambda r: r.timings_s["total"])[repeats // 2]
        first = spec_for(f"dirty_{index}_0", topic, None)
        landed, quarantined, once = count_landed(catalog, first.table, first.quarantine_table)
        seconds = report.timings_s["total"]
        consumed = report.records + report.quarantined
        results.append(
            {
                "workload": workload.name,
                "produced": records,
                "records": consumed,
                "landed": report.records,
                "quarantined": report.quarantined,
                "expected_bad": bad,
                "read_back": [landed, quarantined, once],
                "seconds": round(seconds, 2),
                "all_seconds": [round(r.timings_s["total"], 2) for r in runs],
                "records_per_s": round(consumed / seconds),
                "target": workload.target,
                "versus": workload.versus,
                "files": report.files,
            }
        )
        print(f"  {results[-1]}", flush=True)
    spark_resource.stop_session()
    return results


def print_dirty_table(results: list[dict]) -> bool:
    """Print the table (ratios to the faster clean run, or to the row named by ``versus``);
    return whether every count is exact."""
    rates = {r["workload"]: r["records_per_s"] for r in results}
    rates["clean"] = max(rate for name, rate in rates.items() if name.startswith("clean"))
    print(
        f"\n{'workload':<24}{'records':>9}{'quarant.':>9}{'seconds':>9}{'rec/s':>9}"
        f"{'ratio':>7}{'versus':>9}{'target':>8}{'files':>7}  check"
    )
    ok = True
    for r in results:
        versus = r.get("versus", "clean")
        ratio = r["records_per_s"] / rates[versus]
        exact = (r["records"], r["quarantined"]) == (r["produced"], r["expected_bad"])
        good = r["produced"] - r["expected_bad"]
        exact = exact and r["read_back"] == [good, r["expected_bad"], True]
        fast = r["target"] is None or ratio >= r["target"]
        ok = ok and exact
        target = "" if r["target"] is None else f">={r['target']}"
        verdict = ("ok" if fast else "SLOW") + ("" if exact else " COUNT-MISMATCH")
        print(
            f"{r['workload']:<24}{r['records']:>9}{r['quarantined']:>9}{r['seconds']:>9}"
            f"{r['records_per_s']:>9}{ratio:>7.2f}{versus:>9}{target:>8}{r.get('files', 0):>7}"
            f"  {verdict}"
        )
    return ok
