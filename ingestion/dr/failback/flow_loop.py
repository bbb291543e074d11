"""After a failback: do records of an origin topic come back through its reverse copy?

A failback to the primary reads each origin topic (``orders``) next to its reverse copy
(``dr.orders`` under ``failback_replication_policy: default``; ``ingestion.dr.failback.origin``).
When MM2's forward flow (primary -> replica) runs again while the reverse flow (replica ->
primary) still runs, a record produced to ``orders`` is copied to the replica, and from there back
into ``dr.orders``: the pipeline reads it twice, under two topic names, and neither audit can
relate the two rows (docs/reliability.md, R49). The replica check looks for exactly that evidence:
among the newest records of each reverse-copy partition past the failback's start, one that is
byte for byte (timestamp, key, value, headers: what MM2 copies) a record of the same origin
partition past the origin's own failback start. Copies of records the failback read from the
replica (pending copies, before the origin's start) are expected and not counted. Reads only;
bounded per partition (:data:`SAMPLE` copy records, :data:`ORIGIN_SCAN` origin records).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingestion.kafka.consumer import iter_range, open_consumer
from ingestion.kafka.ranges import Key, OffsetRange
from ingestion.table.offsets import OFFSETS_PREFIX, decode_offsets, flatten, snapshot_properties
from ingestion.table.route import FAILOVER_ORIGIN, FAILOVER_TOPICS, SWITCH_SNAPSHOT, active_switch

if TYPE_CHECKING:
    from confluent_kafka import Message
    from pyiceberg.table import Table

SAMPLE = 100  # newest reverse-copy records compared per partition (a loop keeps adding them)
ORIGIN_SCAN = 20_000  # origin records read per partition to find their twins

Identity = tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


@dataclass(frozen=True)
class LoopedRecord:
    """A reverse-copy record that is a copy of an origin record the route also reads."""

    copy_topic: str
    partition: int
    copy_offset: int
    origin_topic: str
    origin_offset: int


@dataclass(frozen=True)
class FailbackFlows:
    """What a failback in force reads: (origin, reverse copy) topic pairs, and where the route
    started on each partition of both (the group's offsets in the failback switch)."""

    pairs: list[tuple[str, str]]
    starts: dict[Key, int]


def failback_flows(table: Table, group_id: str) -> FailbackFlows | None:
    """The failback in force for ``group_id`` (a switch that put origin topics back on the
    route), or None: no route, a failover to a replica, or the identity/identity naming whose
    reverse copy *is* the origin topic (nothing to compare)."""
    import orjson

    route = active_switch(table, group_id)
    if route is None or FAILOVER_ORIGIN not in route or SWITCH_SNAPSHOT not in route:
        return None
    origins = {str(line["topic"]) for line in orjson.loads(route[FAILOVER_ORIGIN])}
    names = orjson.loads(route.get(FAILOVER_TOPICS, "{}"))
    pairs = sorted((t, str(names[t])) for t in origins if t in names and names[t] != t)
    switch = table.metadata.snapshot_by_id(int(route[SWITCH_SNAPSHOT]))
    text = None if switch is None else snapshot_properties(switch).get(OFFSETS_PREFIX + group_id)
    if not pairs or text is None:
        return None
    return FailbackFlows(pairs, flatten(decode_offsets(text)))


def _identity(message: Message) -> Identity:
    raw = message.headers() or []  # a list of (name, value) for a consumed message
    pairs = raw.items() if isinstance(raw, dict) else raw
    headers = tuple((str(n), v.encode() if isinstance(v, str) else v) for n, v in pairs)
    return (int(message.timestamp()[1]), message.key(), message.value(), headers)


def _read(consumer: Any, key: Key, start: int, end: int) -> list[tuple[int, Identity]]:
    if start >= end:
        return []
    rng = OffsetRange(key[0], key[1], start, end)
    where = f"loop check {key[0]}[{key[1]}]"
    return [(int(m.offset() or 0), _identity(m)) for m in iter_range(consumer, rng, 10.0, where)]


def find_looped_records(
    kafka_config: dict[str, Any], flows: FailbackFlows, timeout_s: float = 10.0
) -> list[LoopedRecord]:
    """Reverse-copy records on the primary (``kafka_config``) that are copies of origin records
    the route reads after the failback (module docstring); [] when there are none."""
    from confluent_kafka import TopicPartition

    found: list[LoopedRecord] = []
    with open_consumer(kafka_config, "loop-check-reader") as consumer:
        for origin, copy in flows.pairs:
            for (topic, partition), copy_start in sorted(flows.starts.items()):
                origin_start = flows.starts.get((origin, partition))
                if topic != copy or origin_start is None:
                    continue
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(copy, partition), timeout=timeout_s
                )
                copies = _read(
                    consumer, (copy, partition), max(copy_start, low, high - SAMPLE), high
                )
                if not copies:
                    continue
                earliest = min(identity[0] for _, identity in copies)
                (at,) = consumer.offsets_for_times(
                    [TopicPartition(origin, partition, earliest)], timeout=timeout_s
                )
                _, origin_end = consumer.get_watermark_offsets(
                    TopicPartition(origin, partition), timeout=timeout_s
                )
                begin = max(origin_start, at.offset if at.offset >= 0 else origin_end)
                end = min(origin_end, begin + ORIGIN_SCAN)
                twins = {
                    i: o for o, i in reversed(_read(consumer, (origin, partition), begin, end))
                }
                found += [
                    LoopedRecord(copy, partition, offset, origin, twins[identity])
                    for offset, identity in copies
                    if identity in twins
                ]
    return found
