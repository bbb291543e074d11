"""Kafka reads that never join a group and never commit: the one owner of consumer settings.

Every consumer of the platform (the planner, the executor tasks, status, the audit's recount,
the dead-letter copy check, the Dagster resource) is configured here, so the settings that
exactly-once reads rely on (rule 3 of docs/reliability.md) are written once:

- ``assign()`` only: the ``group.id`` librdkafka requires is never joined (R25);
- ``enable.auto.commit`` and ``enable.auto.offset.store`` off: nothing is committed to Kafka;
- ``auto.offset.reset=error``: a read never jumps silently to another offset;
- ``isolation.level=read_committed``: aborted records are never read, and the watermark query
  returns the last stable offset (an open upstream transaction is never planned past, R16).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ingestion import exceptions
from ingestion.kafka.clients import client_properties
from ingestion.kafka.ranges import OffsetRange

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

# Set by the engine for exactly-once reads; a user-supplied value is refused, never overridden.
ENGINE_OWNED_PROPERTIES = frozenset(
    {"enable.auto.commit", "auto.offset.reset", "isolation.level", "group.id"}
)
MAX_BATCH = 10_000


def consumer_config(kafka_config: dict[str, Any], role: str) -> dict[str, Any]:
    """librdkafka settings for an ``assign()`` reader; ``role`` names it (``orders-reader``).

    Example:
        >>> config = consumer_config({"bootstrap.servers": "b:9092"}, "orders-reader")
        >>> config["isolation.level"], config["enable.auto.commit"], config["group.id"]
        ('read_committed', False, 'kafka-iceberg-orders-reader')
    """
    properties = client_properties(kafka_config, "consumer")
    owned = sorted(ENGINE_OWNED_PROPERTIES & properties.keys())
    if owned:
        raise ValueError(f"Kafka settings {owned} are owned by the ingestion engine; remove them")
    return {
        **properties,
        "group.id": f"kafka-iceberg-{role}",  # required by librdkafka; never joined
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "isolation.level": "read_committed",
    }


@contextmanager
def open_consumer(kafka_config: dict[str, Any], role: str) -> Iterator[Consumer]:
    """A consumer configured by :func:`consumer_config`, closed on exit."""
    from confluent_kafka import Consumer

    consumer = Consumer(consumer_config(kafka_config, role))
    try:
        yield consumer
    finally:
        consumer.close()


def iter_batches(
    consumer: Consumer, rng: OffsetRange, timeout_s: float, where: str, limit: int | None = None
) -> Iterator[list[Message]]:
    """Yield the visible records of ``[start, end)`` in batches; done when the position reaches
    the end. ``limit``: the caller stops after that many records, so no poll asks for more (it
    returns as soon as they are in, instead of waiting out its timeout for records past them).

    Offsets may have gaps (transaction markers, compaction): the loop never waits for offset
    end - 1 (R14, R15). Records at or after the end (produced after the plan) are not yielded.

    Raises:
        ReadError: a broker error, or no progress for ``timeout_s`` (an impossible end, R17).
    """
    from confluent_kafka import Message, TopicPartition

    consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
    position, last_progress, given = rng.start, time.monotonic(), 0
    while position < rng.end:
        # Ask for no more than the offsets left: consume() then returns as soon as they are
        # in, instead of waiting out its timeout at the end of every range.
        wanted = min(MAX_BATCH, rng.end - position)
        if limit is not None:
            wanted = max(1, min(wanted, limit - given))
        batch = consumer.consume(num_messages=wanted, timeout=0.5)
        failed = next(filter(None, map(Message.error, batch)), None)  # one C-level pass
        if failed is not None:
            raise exceptions.ReadError(f"{where}: {failed}")
        if batch and int(batch[-1].offset() or 0) >= rng.end:  # only the last batch can
            batch = [m for m in batch if int(m.offset() or 0) < rng.end]
        if batch:
            given += len(batch)
            yield batch
        (current,) = consumer.position([TopicPartition(rng.topic, rng.partition)])
        if current.offset > position:
            position, last_progress = current.offset, time.monotonic()
        elif time.monotonic() - last_progress > timeout_s:
            raise exceptions.ReadError(
                f"{where}: no progress past offset {position} for {timeout_s:.0f} s "
                "(planned end beyond the log, or broker unavailable); nothing was committed"
            )
    consumer.unassign()


def iter_range(
    consumer: Consumer, rng: OffsetRange, timeout_s: float, where: str
) -> Iterator[Message]:
    """Yield the visible records of ``[start, end)`` one by one (see :func:`iter_batches`)."""
    for batch in iter_batches(consumer, rng, timeout_s, where):
        yield from batch


def count_visible(
    kafka_config: dict[str, Any], ranges: list[OffsetRange], role: str, timeout_s: float
) -> int:
    """The number of visible (committed, non-marker) records in ``ranges``."""
    with open_consumer(kafka_config, role) as consumer:
        return sum(
            sum(len(batch) for batch in iter_batches(consumer, rng, timeout_s, role))
            for rng in ranges
        )
