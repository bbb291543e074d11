"""The demo data source: realistic order events produced at a steady rate to ``orders``.

Used by ``make dev`` only. Events are JSON, keyed by order id, spread over several partitions;
about 1 % of them are sent twice on purpose (an upstream duplicate, as real producers retry), so
the dbt models have business-key duplicates to remove.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from confluent_kafka import Producer

STATUSES = ("created", "paid", "shipped", "delivered", "cancelled")
CURRENCIES = ("EUR", "USD", "GBP", "CHF")
CHANNELS = ("web", "ios", "android", "store")


def make_order_event(
    rng: random.Random, sequence: int, now: datetime | None = None
) -> dict[str, Any]:
    """Return one order event as a JSON-ready mapping (amount as an exact decimal).

    Example:
        >>> event = make_order_event(random.Random(7), 42)
        >>> sorted(event)[:3], event["order_id"]
        (['amount', 'channel', 'created_at'], 'ord-000000042')
    """
    created = now or datetime.now(tz=UTC)
    cents = rng.randint(199, 250_000)
    return {
        "order_id": f"ord-{sequence:09d}",
        "customer_id": f"cus-{rng.randint(1, 5_000):06d}",
        "status": rng.choices(STATUSES, weights=(30, 40, 15, 10, 5))[0],
        "currency": rng.choice(CURRENCIES),
        "amount": Decimal(cents) / 100,
        "items": rng.randint(1, 8),
        "channel": rng.choice(CHANNELS),
        "created_at": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


def encode_event(event: dict[str, Any]) -> bytes:
    """Encode an event as JSON; decimals are written as JSON numbers with their exact digits."""
    return orjson.dumps(event, default=lambda value: orjson.Fragment(str(value)))


@dataclass
class DemoProducerStats:
    """What the demo producer has sent so far."""

    produced: int = 0
    duplicates: int = 0


def run_demo_producer(
    producer: Producer,
    topic: str,
    stop: threading.Event,
    rate_per_s: float = 20.0,
    duplicate_ratio: float = 0.01,
    seed: int | None = None,
    stats: DemoProducerStats | None = None,
) -> DemoProducerStats:
    """Produce order events to ``topic`` at ``rate_per_s`` until ``stop`` is set.

    Each tick's events are flushed together, so the broker's end offsets are exact at rest.
    """
    rng = random.Random(seed)
    stats = stats or DemoProducerStats()
    tick_s = 0.5
    per_tick = max(1, round(rate_per_s * tick_s))
    while not stop.is_set():
        started = time.monotonic()
        for _ in range(per_tick):
            event = make_order_event(rng, stats.produced)
            value = encode_event(event)
            producer.produce(topic, key=event["order_id"].encode(), value=value)
            stats.produced += 1
            if rng.random() < duplicate_ratio:
                producer.produce(topic, key=event["order_id"].encode(), value=value)
                stats.duplicates += 1
        producer.flush(10)
        stop.wait(max(0.0, tick_s - (time.monotonic() - started)))
    producer.flush(10)
    return stats
