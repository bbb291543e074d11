"""Rows read on one cluster: the ``_kafka_cluster`` filter, and whether it can be trusted.

Every row records the name of the cluster it was read on (``ingestion.table.schema``); a row
written before the column existed reads null, which means ``primary`` (the pipeline's own
cluster). Coordinates are unique within one cluster only: under MM2's ``identity`` naming the
table reads ``orders`` on the primary, then on the replica, at overlapping offsets. A reader
of one cluster's rows filters by the column (:func:`cluster_condition`); a failback trusts that
filter only when the rows read on the replica are labelled (:func:`labelled_cluster`): rows
written before the column would pass for the primary's (docs/cluster-column.md). Reads only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ingestion.table.schema import PRIMARY, cluster_condition, has_cluster_column

if TYPE_CHECKING:
    from pyiceberg.table import Table


def primary_offsets(tables: Iterable[Table], topic: str, partition: int, start: int) -> list[int]:
    """The offsets (one per row, repeats kept) of the rows of ``topic[partition]`` at or after
    ``start`` that count as the primary's (null or ``primary``), data and quarantine tables."""
    offsets: list[int] = []
    for table in tables:
        condition = cluster_condition(table, PRIMARY)
        row_filter = (
            f"_kafka_topic = '{topic}' AND _kafka_partition = {partition} "
            f"AND _kafka_offset >= {start}{condition}"
        )
        rows = table.scan(row_filter=row_filter, selected_fields=("_kafka_offset",)).to_arrow()
        offsets += rows.column("_kafka_offset").to_pylist()
    return offsets


def ambiguous_offsets(
    tables: list[Table], topic: str, partition: int, start: int, before: int
) -> list[int]:
    """Offsets of ``topic[partition]`` whose rows may be the replica's passing for the
    primary's: the table read the primary below ``before`` and the replica (same name) from
    ``start``; a row counting as the primary's at or after ``before``, or two at one offset in
    ``[start, before)``, was read on the replica before the column existed."""
    counts = Counter(primary_offsets(tables, topic, partition, start))
    return sorted(o for o, n in counts.items() if o >= before or n > 1)


def labelled_cluster(
    tables: list[Table], plans: Iterable[Mapping[str, Any]], cluster: str
) -> tuple[str | None, dict[tuple[str, int], list[int]]]:
    """For a failback from ``cluster``, given the failover's per-partition ``plans``
    (``source_topic``, ``partition``, ``replica_topic``, ``replica_start``, ``source_next``):
    ``cluster`` when some replica topic has its origin's name and the rows read on the replica
    are told apart by ``_kafka_cluster`` (readers then filter by it), else None; and per such
    partition the offsets that are ambiguous (rows written before the column)."""
    same_name = [p for p in plans if p.get("source_topic") == p.get("replica_topic")]
    if not same_name or not all(has_cluster_column(t) for t in tables):
        return None, {}
    ambiguous: dict[tuple[str, int], list[int]] = {}
    for plan in same_name:
        topic, partition = str(plan["source_topic"]), int(plan["partition"])
        found = ambiguous_offsets(
            tables, topic, partition, int(plan["replica_start"]), int(plan["source_next"])
        )
        if found:
            ambiguous[(topic, partition)] = found
    return (None if ambiguous else cluster), ambiguous
