"""The measured workloads: produce, the consume-only limit, a naive baseline, and ours."""

from __future__ import annotations

import multiprocessing
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from ingestion.kafka.consumer import consumer_config, iter_batches, iter_range, open_consumer
from ingestion.kafka.ranges import OffsetRange
from ingestion.spec.pipeline import PipelineSpec, load_pipeline_specs
from platform_assets.demo import encode_event, make_order_event

PIPELINES_FILE = Path(__file__).resolve().parent.parent / "platform_assets" / "pipelines.yaml"
BROKER_STOP_S = 0.5
"""How long a bench's embedded broker gets to exit on SIGTERM before SIGKILL, once the figures
are taken. Kafka's controlled shutdown takes seconds; the bench's brokers
and their storage are thrown away."""
KafkaRecord = tuple[bytes | None, bytes | None]
"""A record's key and value (None: no key, a tombstone)."""


def order_record(rng: random.Random, sequence: int) -> KafkaRecord:
    """An order event keyed by its order id."""
    event = make_order_event(rng, sequence)
    return event["order_id"].encode(), encode_event(event)


def spec_for(name: str, topic: str, cap: int | None) -> PipelineSpec:
    (orders,) = load_pipeline_specs(PIPELINES_FILE)
    return orders.model_copy(
        update={
            "name": name,
            "topic": topic,
            "table": f"bench.{name}",
            "quarantine_table": f"bench.{name}_quarantine",
            "consumer_group_id": f"bench-{name}",
            "max_records_per_run": cap,
            "max_records_per_task": 250_000,
            "in_process_max_records": 0,  # the benchmarks measure Spark unless they say not
            "freshness_target_seconds": None,  # throughput, not triggers: no stream mode
        }
    )


@dataclass(frozen=True)
class Workload:
    """One kind of input the benchmarks measure: a row of the workloads table.

    ``event(rng, sequence)`` returns the order event for one record, a mapping (JSON-encoded
    with :func:`encode_event`); the same seed gives the same events, so two workloads differ
    only where their ``event`` functions do.
    """

    name: str
    note: str
    event: Callable[[random.Random, int], dict[str, Any]]


ONE_DAY = datetime(2026, 11, 2, 12, tzinfo=UTC)


def _spread(rng: random.Random, sequence: int, days: int = 30) -> dict[str, Any]:
    """The demo event, created on one of ``days`` days before ONE_DAY: runs of 8 records per
    day, so that each Kafka partition (up to 8, filled round-robin) sees every day."""
    return make_order_event(rng, sequence, ONE_DAY - timedelta(days=sequence // 8 % days))


DEMO = Workload("demo", "order events created now (one or two day-partitions)", make_order_event)
ONE_PARTITION = Workload(
    "one_partition",
    "the spread events, all created on one day (one day-partition)",
    lambda rng, sequence: make_order_event(rng, sequence, ONE_DAY),
)
SPREAD_30_DAYS = Workload(
    "spread_30d", "order events spread over 30 day-partitions, interleaved", _spread
)
WORKLOADS = [DEMO, ONE_PARTITION, SPREAD_30_DAYS]
"""Every workload, by name in the printouts (bench/writer.py compares the last two)."""


def produce(
    kafka_config: dict[str, Any],
    topic: str,
    records: int,
    partitions: int,
    workload: Workload = DEMO,
    make: Callable[[random.Random, int], KafkaRecord] | None = None,
) -> float:
    """Produce ``records`` records round-robin: ``make``'s if given (dirty workloads), else the
    events of ``workload``; return records/s.

    Each partition's last record goes in a batch of its own (after a flush): a habit from a
    broker whose end offsets under-counted batches; harmless on Kafka.
    """
    from confluent_kafka import Producer

    producer = Producer(
        {
            **kafka_config,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "enable.idempotence": True,
        }
    )
    rng = random.Random(42)
    started = time.monotonic()
    last = {}
    for i in range(records):
        if make is not None:
            record = make(rng, i)
        else:
            event = workload.event(rng, i)
            record = (event["order_id"].encode(), encode_event(event))
        partition = i % partitions
        if i >= records - partitions:
            last[partition] = record
            continue
        while True:
            try:
                producer.produce(topic, key=record[0], value=record[1], partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    for partition, (key, value) in last.items():
        producer.produce(topic, key=key, value=value, partition=partition)
    producer.flush(60)
    return records / (time.monotonic() - started)


def _consume_only(args: tuple[dict[str, Any], list[OffsetRange]]) -> tuple[int, float]:
    config, ranges = args
    with open_consumer(config, "bench-limit") as consumer:
        started = time.monotonic()
        counted = sum(len(b) for r in ranges for b in iter_batches(consumer, r, 60, "limit"))
    return counted, time.monotonic() - started


def limit(kafka_config: dict[str, Any], ranges: list[OffsetRange], processes: int) -> float:
    """Consume-only records/s with ``processes`` processes (the job's task slots): no decode.

    Timed inside the processes (start-up excluded, as the warm Spark session's is for ours).
    """
    shares = [ranges[i::processes] for i in range(processes)]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        results = pool.map(_consume_only, [(kafka_config, share) for share in shares])
    return sum(count for count, _ in results) / max(seconds for _, seconds in results)


def baseline(
    kafka_config: dict[str, Any], ranges: list[OffsetRange], table: Any, batch: int = 100_000
) -> float:
    """A naive single process: consume, orjson per record, ``table.append`` per batch with the
    offsets in the snapshot properties (what dlt-style loaders do). Returns records/s."""
    from confluent_kafka import Consumer

    schema = table.schema().as_arrow()
    consumer = Consumer(consumer_config(kafka_config, "bench-baseline"))
    started, total = time.monotonic(), 0
    rows: list[dict[str, Any]] = []
    offsets: dict[str, int] = {}

    def flush() -> None:
        table.append(
            pa.Table.from_pylist(rows, schema=schema),
            snapshot_properties={"offsets": orjson.dumps(offsets).decode()},
        )
        rows.clear()

    try:
        for r in ranges:
            for message in iter_range(consumer, r, 60, "baseline"):
                event = orjson.loads(message.value() or b"{}")
                event["amount"] = Decimal(str(event["amount"]))
                event["created_at"] = datetime.fromisoformat(event["created_at"])
                event["_kafka_topic"], event["_kafka_partition"] = r.topic, r.partition
                event["_kafka_offset"] = message.offset()
                event["_kafka_key"] = (message.key() or b"").decode()
                event["_kafka_timestamp"] = datetime.fromtimestamp(
                    message.timestamp()[1] / 1000, UTC
                )
                rows.append(event)
                offsets[f"{r.topic}:{r.partition}"] = int(message.offset() or 0) + 1
                total += 1
                if len(rows) >= batch:
                    flush()
        if rows:
            flush()
    finally:
        consumer.close()
    return total / (time.monotonic() - started)
