"""How many clusters read each offset of the table: the full audit's allowance for duplicates.

Under MM2's identity naming a failback reads a topic with the same name on the other cluster
(``primary.orders`` on the replica, then its reverse copy on the primary; docs/reliability.md,
R49). Rows that record their cluster (``_kafka_cluster``) are counted by (cluster, topic,
partition, offset) only: one row per cluster at a coordinate is not a duplicate, two rows of
one cluster are, whatever the lineage says, so the rule holds after snapshot expiry
(:func:`count_duplicates`). Rows written before the column record topic, partition and offset,
not the cluster; at a coordinate holding such a null row, the coordinate may occur once per
cluster that read it. From the group's commits along the (unexpired) lineage and the cluster
each read (:func:`~ingestion.audit.incremental.clusters_by_snapshot`), each cluster's committed
ranges per partition are known; such a coordinate is a duplicate when it occurs more often than
the number of clusters whose ranges hold it (at least once, :func:`allowed_copies`). A topic
read on one cluster keeps the plain rule: each coordinate at most once. Reads snapshot metadata,
and the rows' coordinates for :func:`read_labelled`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from ingestion.audit.incremental import clusters_by_snapshot
from ingestion.kafka.ranges import Coordinates, Key
from ingestion.table.offsets import (
    OFFSETS_PREFIX,
    RESET_BY,
    decode_offsets,
    flatten,
    iter_ancestry,
    snapshot_properties,
)
from ingestion.table.schema import CLUSTER_COLUMN, PRIMARY, labels_cluster

if TYPE_CHECKING:
    from pyiceberg.table import Table


def read_ranges(table: Table, group_id: str) -> dict[Key, dict[str, list[tuple[int, int]]]]:
    """Per partition, per cluster, the offset ranges the group's commits read there."""
    key = OFFSETS_PREFIX + group_id
    clusters = clusters_by_snapshot(table, group_id)
    ranges: dict[Key, dict[str, list[tuple[int, int]]]] = {}
    previous: dict[Key, int] = {}
    for snapshot in reversed(list(iter_ancestry(table))):
        properties = snapshot_properties(snapshot)
        if key not in properties:
            continue
        current = flatten(decode_offsets(properties[key]))
        if RESET_BY not in properties:  # a reset or a switch reads nothing
            cluster = clusters.get(snapshot.snapshot_id, PRIMARY)
            for part, end in current.items():
                start = previous.get(part, 0)
                if end > start:
                    ranges.setdefault(part, {}).setdefault(cluster, []).append((start, end))
        previous = current
    return ranges


def holders(by_cluster: dict[str, list[tuple[int, int]]], offset: int) -> int:
    """How many clusters' ranges hold ``offset``, at least 1.

    Example:
        >>> holders({"dr": [(0, 10)], "primary": [(5, 8)]}, 6), holders({"dr": [(0, 10)]}, 12)
        (2, 1)
    """
    return max(1, sum(any(s <= offset < e for s, e in spans) for spans in by_cluster.values()))


def allowed_copies(table: Table, group_id: str) -> Callable[[Coordinates], int]:
    """How many times a coordinate may occur in the table (:func:`holders`)."""
    ranges = read_ranges(table, group_id)
    shared = {part: by for part, by in ranges.items() if len(by) > 1}

    def allowed(coordinates: Coordinates) -> int:
        by_cluster = shared.get((coordinates[0], coordinates[1]))
        return 1 if by_cluster is None else holders(by_cluster, coordinates[2])

    return allowed


def read_labelled(table: Table) -> list[tuple[Coordinates, str | None]]:
    """Every row's (topic, partition, offset) and ``_kafka_cluster`` (None: written before the
    column, or a table without it), as any reader sees the table (no filter)."""
    labelled = labels_cluster(table.schema())
    columns = ("_kafka_topic", "_kafka_partition", "_kafka_offset")
    rows = table.scan(selected_fields=(*columns, CLUSTER_COLUMN) if labelled else columns)
    found = rows.to_arrow()
    coordinates = zip(*(found.column(name).to_pylist() for name in columns), strict=True)
    clusters = found.column(CLUSTER_COLUMN).to_pylist() if labelled else [None] * len(found)
    return list(zip(coordinates, clusters, strict=True))


def count_duplicates(
    rows: list[tuple[Coordinates, str | None]], allowed: Callable[[Coordinates], int]
) -> list[Coordinates]:
    """The coordinates the full audit reports as duplicates, sorted.

    A coordinate whose rows all record their cluster is a duplicate when two rows record one
    cluster (counted by (cluster, coordinate) only; ``allowed`` is not asked). A coordinate
    holding a null row (written before the column) is a duplicate when two rows record one
    cluster, or when it occurs more often than ``allowed`` (:func:`allowed_copies`).

    Example:
        >>> rows = [(("t", 0, 5), "dr"), (("t", 0, 5), "primary"), (("t", 0, 6), "dr"),
        ...     (("t", 0, 6), "dr"), (("t", 0, 7), None), (("t", 0, 7), "dr"),
        ...     (("t", 0, 8), None), (("t", 0, 8), None), (("t", 0, 9), None)]
        >>> count_duplicates(rows, lambda coordinates: 1)
        [('t', 0, 6), ('t', 0, 7), ('t', 0, 8)]
        >>> count_duplicates(rows, lambda coordinates: 2)
        [('t', 0, 6)]
    """
    counts = Counter(c for c, _ in rows)
    unlabelled = {c for c, cluster in rows if cluster is None}
    labelled = Counter((c, cluster) for c, cluster in rows if cluster is not None)
    twice = {c for (c, _), n in labelled.items() if n > 1}
    return sorted(
        c for c, n in counts.items() if c in twice or (c in unlabelled and n > allowed(c))
    )
