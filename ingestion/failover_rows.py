"""The table's rows of a Kafka partition, as a failover or failback plan aligns them.

The data and quarantine tables hold each ingested record once, with its Kafka coordinates,
timestamp and key (``_kafka_*`` columns). A plan reads the rows of one partition in an offset
window (:func:`ingested_tail`), every partition of a topic in one scan
(:func:`ingested_partitions`: each scan plans the table's files anew, reading every
manifest, which dominates a failback plan on a table of many small files), or asks only
whether a row exists (:func:`holds_rows`, the first row found answers).
:class:`ScannedRows` answers windows from a scan made once per plan. Reads only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingestion.cluster_rows import cluster_condition
from ingestion.exceptions import FailoverRefusedError
from ingestion.failover_align import RecordId

if TYPE_CHECKING:
    from pyiceberg.table import Table

Records = list[tuple[int, RecordId]]


def ingested_tail(
    tables: list[Table],
    topic: str,
    partition: int,
    from_offset: int,
    until: int,
    cluster: str | None = None,
) -> Records:
    """Records of ``topic[partition]`` with ``from_offset <= offset < until`` that the data or
    quarantine table holds (read on ``cluster``, if given), in offset order, as (offset,
    RecordId)."""
    return ingested_tail_where(
        tables,
        (topic, partition),
        f"_kafka_offset >= {from_offset} AND _kafka_offset < {until}",
        cluster,
    )


def ingested_tail_where(
    tables: list[Table], key: tuple[str, int], condition: str, cluster: str | None = None
) -> Records:
    """The records of one partition matching ``condition``, from the data and quarantine
    tables, in offset order; with ``cluster``, only the rows read on that cluster
    (``ingestion.cluster_rows``: under MM2's identity naming one name is read on two)."""
    where = f"_kafka_partition = {key[1]} AND {condition}"
    return ingested_partitions(tables, key[0], where, cluster).get(key[1], [])


def ingested_partitions(
    tables: list[Table], topic: str, condition: str, cluster: str | None = None
) -> dict[int, Records]:
    """The records of ``topic`` matching ``condition`` per partition, from the data and
    quarantine tables (one scan each), in offset order; ``cluster``: see
    :func:`ingested_tail_where`."""
    import pyarrow as pa

    rows: dict[int, dict[int, RecordId]] = {}
    # Kafka topic names are [a-zA-Z0-9._-]: safe inside a quoted literal.
    row_filter = f"_kafka_topic = '{topic}' AND {condition}"
    fields = ("_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key")
    for table in tables:
        on_cluster = cluster_condition(table, cluster)
        if on_cluster is None:
            continue  # no row of this table was read on that cluster
        scanned = table.scan(row_filter=row_filter + on_cluster, selected_fields=fields).to_arrow()
        partitions = scanned.column("_kafka_partition").to_pylist()
        offsets = scanned.column("_kafka_offset").to_pylist()
        micros = scanned.column("_kafka_timestamp").cast(pa.int64()).to_pylist()
        keys = scanned.column("_kafka_key").to_pylist()
        for partition, offset, stamp, record_key in zip(
            partitions, offsets, micros, keys, strict=True
        ):
            if isinstance(record_key, dict):
                raise FailoverRefusedError(
                    f"{'.'.join(table.name())}: the table keeps the Kafka keys decoded "
                    "(key_format: json), not their bytes, so its records cannot be matched with "
                    "the replica's; a "
                    "failover of this pipeline is not supported (reset its offsets on the "
                    "replica explicitly instead); nothing was changed"
                )
            raw = record_key.encode() if isinstance(record_key, str) else record_key
            rows.setdefault(int(partition), {})[int(offset)] = RecordId(int(stamp) // 1000, raw)
    return {partition: sorted(found.items()) for partition, found in rows.items()}


def holds_rows(
    tables: list[Table], key: tuple[str, int], condition: str, cluster: str | None = None
) -> bool:
    """Whether the data or quarantine table holds a row of one partition matching
    ``condition`` (read on ``cluster``, if given): the first row found answers, not a read of
    every match."""
    row_filter = f"_kafka_topic = '{key[0]}' AND _kafka_partition = {key[1]} AND {condition}"
    for table in tables:
        on_cluster = cluster_condition(table, cluster)
        if on_cluster is None:
            continue  # no row of this table was read on that cluster
        found = table.scan(
            row_filter=row_filter + on_cluster, selected_fields=("_kafka_offset",), limit=1
        ).to_arrow()
        if found.num_rows:
            return True
    return False


@dataclass(frozen=True)
class ScannedRows:
    """The table's rows of one topic from offset ``since`` on, per partition (one scan per plan,
    read on the plan's cluster): the windows it covers are answered without another scan.

    Example:
        >>> rows = ScannedRows(10, {0: [(10, RecordId(1, b"a")), (12, RecordId(2, b"b"))]})
        >>> rows.window(0, 11, 13), rows.window(0, 9, 13), rows.window(1, 10, 20)
        ([(12, RecordId(timestamp_ms=2, key=b'b', value_digest=None))], None, [])
        >>> rows.holds_until(0, 11), rows.holds_until(0, 9), rows.holds_until(1, 50)
        (True, None, None)
    """

    since: int
    partitions: dict[int, Records]

    def window(self, partition: int, start: int, until: int) -> Records | None:
        """The rows with ``start <= offset < until``; None when the scan does not cover them."""
        if start < self.since:
            return None
        rows = self.partitions.get(partition, [])
        return [(offset, row) for offset, row in rows if start <= offset < until]

    def holds_until(self, partition: int, offset: int) -> bool | None:
        """True when a row at or below ``offset`` was scanned; None when only rows below
        ``since`` could tell (the scan does not cover them)."""
        rows = self.partitions.get(partition, [])
        return True if rows and rows[0][0] <= offset else None


Scans = dict[tuple[str, int, str | None], ScannedRows]
"""One plan's scans by (topic, since, cluster): the failback's two stages read them once."""


def scan_rows(
    tables: list[Table],
    topic: str,
    since: int,
    cluster: str | None = None,
    scans: Scans | None = None,
) -> ScannedRows:
    """:class:`ScannedRows` of ``topic`` from ``since``: one scan per table, or the one
    ``scans`` holds (the same plan read it, after the same quarantine sync; rows committed in
    between lie past the offsets the plan read, which every window stops before)."""
    key = (topic, since, cluster)
    if scans is not None and key in scans:
        return scans[key]
    found = ScannedRows(
        since, ingested_partitions(tables, topic, f"_kafka_offset >= {since}", cluster)
    )
    if scans is not None:
        scans[key] = found
    return found
