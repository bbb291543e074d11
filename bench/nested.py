"""The nested-data suite: nested JSON order events and Kafka headers against flat demo orders.

    .venv/bin/python bench/run.py --suite nested [--records 300000] [--repeats 3]
    .venv/bin/python bench/run.py --suite all    # dirty + nested workloads in one table

Each workload is produced to its own topic on the embedded broker and ingested by the engine
(``run_pipeline``, ``local[2]``) ``--repeats`` times in one Spark session (the median is shown);
the ratio is to the faster ``clean`` (flat demo orders) run of the same process. Workloads:
``nested`` (a customer struct with a nested address, a list of item structs, a
``map<string,string>``), ``nested, no map`` (the same without the map: what the map costs),
``clean + headers`` (flat orders with three headers each, ``headers: true``), and
``clean + headers (not stored)`` (the same topic, ``headers: false``: what reading the headers
from Kafka costs, apart from storing them). Then a cProfile of one in-process nested task.
"""

from __future__ import annotations

import cProfile
import pstats
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.dirty import count_landed
from bench.workloads import spec_for
from platform_assets.demo import encode_event, make_order_event

PARTITIONS = 6
SLOTS = 2
Headers = list[tuple[str, str | bytes | None]] | None
Record = tuple[bytes, bytes, Headers]

NESTED_SCHEMA: list[dict[str, Any]] = [
    {"name": "order_id", "type": "string", "required": True},
    {
        "name": "customer",
        "type": "struct<id:string not null, tier:string, address:struct<city:string, "
        "country:string>>",
    },
    {"name": "status", "type": "string"},
    {"name": "amount", "type": "decimal(12,2)"},
    {"name": "items", "type": "list<struct<sku:string not null, qty:int, price:decimal(12,2)>>"},
    {"name": "attributes", "type": "map<string, string>"},
    {"name": "created_at", "type": "timestamptz"},
]
CITIES = [("Berlin", "DE"), ("Lyon", "FR"), ("Austin", "US"), ("Osaka", "JP"), ("Porto", "PT")]


def nested_event(rng: random.Random, sequence: int, with_map: bool = True) -> dict[str, Any]:
    """An order event with nested parts, from the same draws as the flat demo event."""
    flat = make_order_event(rng, sequence)
    city, country = rng.choice(CITIES)
    event: dict[str, Any] = {
        "order_id": flat["order_id"],
        "customer": {
            "id": flat["customer_id"],
            "tier": rng.choice(["gold", "silver", None]),
            "address": {"city": city, "country": country},
        },
        "status": flat["status"],
        "amount": flat["amount"],
        "items": [
            {"sku": f"sku-{rng.randint(1, 999):03d}", "qty": rng.randint(1, 4), "price": "9.99"}
            for _ in range(1 + flat["items"] % 3)
        ],
        "created_at": flat["created_at"],
    }
    if with_map:
        event["attributes"] = {"channel": flat["channel"], "currency": flat["currency"]}
    return event


def flat_record(rng: random.Random, sequence: int) -> Record:
    event = make_order_event(rng, sequence)
    return event["order_id"].encode(), encode_event(event), None


def with_headers(rng: random.Random, sequence: int) -> Record:
    key, value, _ = flat_record(rng, sequence)
    trace = f"{sequence:016x}".encode()
    return key, value, [("trace-id", trace), ("source", b"web"), ("hop", b"\x01\x02")]


def nested_record(with_map: bool) -> Callable[[random.Random, int], Record]:
    def make(rng: random.Random, sequence: int) -> Record:
        event = nested_event(rng, sequence, with_map)
        return event["order_id"].encode(), encode_event(event), None

    return make


@dataclass(frozen=True)
class Workload:
    """One topic's records and the pipeline overrides that read it."""

    name: str
    make: Callable[[random.Random, int], Record]
    overrides: dict[str, Any] = field(default_factory=dict)
    target: float | None = None
    topic: str | None = None  # None: its own topic; else read another workload's topic


NESTED_OVERRIDES = {"schema": NESTED_SCHEMA}
NO_MAP = {"schema": [f for f in NESTED_SCHEMA if f["name"] != "attributes"]}
WORKLOADS = [
    Workload("clean", flat_record),
    Workload("nested", nested_record(True), NESTED_OVERRIDES, target=0.5),
    Workload("nested, no map", nested_record(False), NO_MAP),
    Workload("clean + headers", with_headers, {"headers": True}, topic="headers"),
    Workload("clean + headers (not stored)", with_headers, {}, topic="headers"),
    Workload("clean (repeat)", flat_record),
]


def produce_records(
    kafka_config: dict[str, Any], topic: str, records: int, make: Callable[..., Record]
) -> None:
    """Produce round-robin over the partitions; each partition's last record alone (a habit
    from a broker whose end offsets under-counted batches; harmless on Kafka)."""
    from confluent_kafka import Producer

    producer = Producer({**kafka_config, "linger.ms": 50, "batch.size": 1_000_000})
    rng = random.Random(42)
    last: dict[int, Record] = {}
    for i in range(records):
        record, partition = make(rng, i), i % PARTITIONS
        if i >= records - PARTITIONS:
            last[partition] = record
            continue
        while True:
            try:
                producer.produce(topic, record[1], record[0], partition, headers=record[2])
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    for partition, (key, value, headers) in last.items():
        producer.produce(topic, value, key, partition, headers=headers)
    producer.flush(60)


def run_nested_suite(
    kafka: Any, catalog: Any, records: int, repeats: int = 3, workloads: list[Workload] = WORKLOADS
) -> list[dict[str, Any]]:
    """Produce and ingest every workload; one result per workload (bench/dirty.py's shape)."""
    from confluent_kafka.admin import NewTopic

    from ingestion.pipeline.run import run_pipeline
    from ingestion.spec.pipeline import parse_pipeline_spec
    from resources.spark import SparkResource

    topics = [w.topic or f"nested-{i}" for i, w in enumerate(workloads)]
    unique = list(dict.fromkeys(topics))
    admin = kafka.get_admin_client()
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in unique]).values():
        future.result(15)
    for topic in unique:
        workload = workloads[topics.index(topic)]
        produce_records(kafka.client_config(), topic, records, workload.make)
        print(f"produced {topic}: {records:,}", flush=True)
    spark_resource = SparkResource(master=f"local[{SLOTS}]")
    spark = spark_resource.spark_session
    results = []
    for index, (workload, topic) in enumerate(zip(workloads, topics, strict=True)):
        runs, read_back = [], []
        for repeat in range(repeats + 1):  # the first run of each workload warms up, untimed
            spec = spec_for(f"nested_{index}_{repeat}", topic, None)
            spec = parse_pipeline_spec({**spec.model_dump(by_alias=True), **workload.overrides})
            report = run_pipeline(
                spec, kafka.client_config(), catalog, spark, kafka.get_cluster_id()
            )
            if repeat:
                runs.append(report)
            if repeat == 1:  # every repeat ingests the whole topic into its own table
                read_back = list(count_landed(catalog, spec.table, spec.quarantine_table))
        report = sorted(runs, key=lambda r: r.timings_s["total"])[len(runs) // 2]
        seconds = report.timings_s["total"]
        results.append(
            {
                "workload": workload.name,
                "produced": records,
                "records": report.records + report.quarantined,
                "landed": report.records,
                "quarantined": report.quarantined,
                "expected_bad": 0,
                "read_back": read_back,
                "files": report.files,
                "seconds": round(seconds, 2),
                "all_seconds": [round(r.timings_s["total"], 2) for r in runs],
                "records_per_s": round((report.records + report.quarantined) / seconds),
                "target": workload.target,
            }
        )
        print(f"  {results[-1]}", flush=True)
    spark_resource.stop_session()
    return results


def profile_nested(kafka: Any, catalog: Any, topic: str, top: int = 12) -> list[str]:
    """Self time of the top functions in one in-process run of the nested workload."""
    from ingestion.pipeline.run import run_pipeline
    from ingestion.spec.pipeline import parse_pipeline_spec

    spec = spec_for("nested_profile", topic, None)
    raw = {**spec.model_dump(by_alias=True), **NESTED_OVERRIDES}
    spec = parse_pipeline_spec(raw)
    profiler = cProfile.Profile()
    started = time.monotonic()
    profiler.enable()
    report = run_pipeline(spec, kafka.client_config(), catalog, None, kafka.get_cluster_id())
    profiler.disable()
    elapsed = time.monotonic() - started
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]  # type: ignore[attr-defined]
    lines = [f"in-process nested run: {report.records:,} records in {elapsed:.1f} s"]
    lines += [f"{fn[2]} ({Path(fn[0]).name}:{fn[1]}): {v[2]:.2f} s self" for fn, v in rows]
    return lines
