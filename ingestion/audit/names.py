"""Duplicates under two topic names: one record ingested from a topic and from its MM2 copy.

The coordinates audit (``ingestion.audit.oracle``) counts each (topic, partition, offset) once. A
failover or failback reads MM2's copies under other names (``primary.orders`` on the replica,
``dr.orders`` or ``primary.orders`` back on the primary; docs/reliability.md, R49), at other
offsets, so a record the table holds both from ``orders`` and from a copy has two distinct
coordinates and passes. MM2 copies timestamp, key, value and headers, and the platform decodes
both the same way, so the two rows are equal but for topic and offset. This audit finds such
twins in the data table: rows of one name *family* (a spec topic and every name MM2 gives it
under the pipeline's replicas, ``ingestion.replicas``) with equal partition, timestamp and key
under two different names, then confirmed by every other column. Repeats under one name are
the topic's own (a producer sent the record twice) and are not reported; the same name read on
two clusters (identity naming) is outside its reach, since rows do not record the cluster.
Reads only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyiceberg.table import Table

MAX_CANDIDATES = 10_000  # (partition, timestamp, key) collisions confirmed row by row
DIFFERENT = ("_kafka_topic", "_kafka_offset")  # what a record and its copy may differ in


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def find_cross_name_twins(table: Table, families: Iterable[frozenset[str]]) -> list[str]:
    """Rows of ``table`` equal to a row under another name of the same family, one line per
    twin (``orders[0]@12 = primary.orders[0]@9``); [] when there is none. One scan of the
    family's coordinates, then one scan per partition with collisions to confirm them."""
    named = {name: index for index, family in enumerate(families) for name in family}
    if not named:
        return []
    fields = ("_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key")
    # Kafka topic names are [a-zA-Z0-9._-]: safe inside quoted literals.
    listed = ", ".join(f"'{name}'" for name in sorted(named))
    scan = table.scan(row_filter=f"_kafka_topic IN ({listed})", selected_fields=fields)
    groups: dict[tuple[Any, ...], set[str]] = {}
    located: dict[tuple[Any, ...], list[tuple[str, int]]] = {}
    for row in scan.to_arrow().to_pylist():
        topic, partition = row["_kafka_topic"], row["_kafka_partition"]
        ident = (named[topic], partition, row["_kafka_timestamp"], _hashable(row["_kafka_key"]))
        groups.setdefault(ident, set()).add(topic)
        located.setdefault(ident, []).append((topic, row["_kafka_offset"]))
    wanted: dict[int, list[tuple[str, int]]] = {}
    collided = [ident for ident, topics in groups.items() if len(topics) > 1]
    for ident in collided[:MAX_CANDIDATES]:
        wanted.setdefault(ident[1], []).extend(located[ident])
    return [
        line
        for partition, rows in sorted(wanted.items())
        for line in _confirm(table, partition, rows)
    ]


def _confirm(table: Table, partition: int, members: list[tuple[str, int]]) -> list[str]:
    """The rows among ``members`` (one partition) equal in every column but topic and offset
    to a row under another name."""
    by_topic: dict[str, list[int]] = {}
    for topic, offset in members:
        by_topic.setdefault(topic, []).append(offset)
    where = " OR ".join(
        f"(_kafka_topic = '{topic}' AND _kafka_offset IN ({', '.join(map(str, offsets))}))"
        for topic, offsets in sorted(by_topic.items())
    )
    rows = table.scan(row_filter=f"_kafka_partition = {partition} AND ({where})").to_arrow()
    seen: dict[Any, tuple[str, int]] = {}
    twins = []
    for row in sorted(rows.to_pylist(), key=lambda r: (r["_kafka_topic"], r["_kafka_offset"])):
        body = _hashable({k: v for k, v in row.items() if k not in DIFFERENT})
        first = seen.setdefault(body, (row["_kafka_topic"], row["_kafka_offset"]))
        if first[0] != row["_kafka_topic"]:
            twins.append(
                f"{first[0]}[{partition}]@{first[1]} = "
                f"{row['_kafka_topic']}[{partition}]@{row['_kafka_offset']}"
            )
    return twins
