"""The dirty-data suite: clean order events against bad records at 0.1 %, 1 % and 10 %.

    .venv/bin/python bench/run.py --suite dirty [--records 300000] [--repeats 3] [--json PATH]

Each workload is produced to its own topic on the embedded broker and ingested by the engine
(``run_pipeline``, local Spark) at the same parallelism, in one Spark session, ``--repeats``
times (a fresh table and group each time; the median is shown). Throughput counts every offset
consumed (rows landed + rows quarantined); the table prints each workload's ratio to the faster
clean run of the same process, and its target (``SLOW`` when missed). The exit status is 1 only
when a count is wrong. Add a row by adding a :class:`Workload` to ``WORKLOADS``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.workloads import KafkaRecord, produce, spec_for
from platform_assets.demo import encode_event, make_order_event

PARTITIONS = 6
SLOTS = 2
Corrupt = Callable[[bytes, dict[str, Any]], KafkaRecord]
"""(key, event) -> the bad record that replaces it."""


@dataclass(frozen=True)
class Workload:
    """A topic of order events where a share ``rate`` of the records is replaced by ``corrupt``.

    ``target``: the lowest acceptable throughput relative to the clean workload (None: shown
    only). ``overrides``: changes to the bench pipeline spec (the ``orders`` pipeline).
    """

    name: str
    rate: float = 0.0
    corrupt: Corrupt | None = None
    target: float | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def maker(self, counter: list[int]) -> Callable[[random.Random, int], KafkaRecord]:
        """The record maker for ``produce``; counts the bad records made in ``counter[0]``."""
        choose = random.Random(f"{self.name}-bad")

        def make(rng: random.Random, sequence: int) -> KafkaRecord:
            event = make_order_event(rng, sequence)
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


KINDS: list[tuple[str, Corrupt, dict[float, float]]] = [
    ("malformed", truncated, {0.001: 0.8, 0.01: 0.8, 0.1: 0.5}),
    ("tombstone", tombstone, {}),
    ("bad key", bad_key, {}),
    ("missing required", missing_required, {}),
]
WORKLOADS: list[Workload] = [
    Workload("clean"),
    *(
        Workload(f"{kind} {rate:.1%}", rate, corrupt, targets.get(rate))
        for kind, corrupt, targets in KINDS
        for rate in (0.001, 0.01, 0.1)
    ),
    Workload("clean (repeat)"),  # drift over the run; the ratios use the faster clean run
]


def run_suite(
    kafka: Any, catalog: Any, records: int, workloads: list[Workload], repeats: int = 3
) -> list[dict]:
    """Produce and ingest every workload in turn; return one result per workload."""
    from confluent_kafka.admin import NewTopic

    from ingestion.run import run_pipeline
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
    results = []
    for index, (workload, topic, bad) in enumerate(zip(workloads, topics, bad_counts, strict=True)):
        runs = []
        for repeat in range(repeats):
            spec = spec_for(f"dirty_{index}_{repeat}", topic, None)
            spec = spec.model_copy(update=workload.overrides)
            runs.append(
                run_pipeline(spec, kafka.client_config(), catalog, spark, kafka.get_cluster_id())
            )
        report = sorted(runs, key=lambda r: r.timings_s["total"])[repeats // 2]
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
                "seconds": round(seconds, 2),
                "all_seconds": [round(r.timings_s["total"], 2) for r in runs],
                "records_per_s": round(consumed / seconds),
                "target": workload.target,
            }
        )
        print(f"  {results[-1]}", flush=True)
    spark_resource.stop_session()
    return results


def print_dirty_table(results: list[dict]) -> bool:
    """Print the table (ratios to the faster clean run); return whether every count is exact."""
    clean = max(r["records_per_s"] for r in results if r["workload"].startswith("clean"))
    print(
        f"\n{'workload':<24}{'records':>9}{'quarant.':>9}{'seconds':>9}{'rec/s':>9}"
        f"{'x clean':>9}{'target':>8}  check"
    )
    ok = True
    for r in results:
        ratio = r["records_per_s"] / clean
        exact = (r["records"], r["quarantined"]) == (r["produced"], r["expected_bad"])
        fast = r["target"] is None or ratio >= r["target"]
        ok = ok and exact
        target = "" if r["target"] is None else f">={r['target']}"
        verdict = ("ok" if fast else "SLOW") + ("" if exact else " COUNT-MISMATCH")
        print(
            f"{r['workload']:<24}{r['records']:>9}{r['quarantined']:>9}{r['seconds']:>9}"
            f"{r['records_per_s']:>9}{ratio:>9.2f}{target:>8}  {verdict}"
        )
    return ok
