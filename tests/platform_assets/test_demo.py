"""The demo producer: realistic, keyed, exact-decimal order events at a steady rate."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime
from decimal import Decimal

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ingestion.spec.pipeline import load_pipeline_specs
from platform_assets.demo import (
    DemoProducerStats,
    encode_event,
    make_order_event,
    run_demo_producer,
)
from platform_assets.pipelines import PIPELINES_FILE


def test_event_matches_the_demo_pipeline_schema() -> None:
    (orders,) = load_pipeline_specs(PIPELINES_FILE)
    assert orders.schema_fields is not None
    declared = {field.name for field in orders.schema_fields}
    event = make_order_event(random.Random(1), 5, now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert set(event) == declared
    assert event["created_at"] == "2026-01-02T03:04:05.000Z"


@pytest.mark.parametrize("seed", range(5))
def test_encoded_amount_keeps_exact_digits(seed: int) -> None:
    event = make_order_event(random.Random(seed), seed)
    raw = encode_event(event)
    decoded = orjson.loads(raw)
    assert Decimal(raw.split(b'"amount":')[1].split(b",")[0].decode()) == event["amount"]
    assert decoded["order_id"] == event["order_id"]
    assert 120 <= len(raw) <= 300


def test_run_demo_producer_on_librdkafka_mock_cluster() -> None:
    """Unit test on librdkafka's built-in mock cluster (topics auto-created, 4 partitions)."""
    config = {"test.mock.num.brokers": 1}
    producer = Producer(config)
    bootstrap = producer.list_topics(timeout=5).orig_broker_name.split("/")[0]
    stop = threading.Event()
    stats = DemoProducerStats()
    thread = threading.Thread(
        target=run_demo_producer,
        kwargs={
            "producer": producer,
            "topic": "orders",
            "stop": stop,
            "rate_per_s": 200.0,
            "duplicate_ratio": 0.5,
            "seed": 3,
            "stats": stats,
        },
    )
    thread.start()
    stop.wait(1.2)
    stop.set()
    thread.join(15)
    assert stats.produced >= 100
    assert stats.duplicates > 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "x"})
    try:
        metadata = consumer.list_topics("orders", timeout=5)
        ends = [
            consumer.get_watermark_offsets(TopicPartition("orders", p), timeout=5)[1]
            for p in metadata.topics["orders"].partitions
        ]
    finally:
        consumer.close()
    assert sum(ends) == stats.produced + stats.duplicates
