"""The table's rows of a Kafka partition, as a failover or failback plan aligns them.

The data and quarantine tables hold each ingested record once, with its Kafka coordinates,
timestamp and key (``_kafka_*`` columns). A plan reads the rows of one partition in an offset
window (:func:`ingested_tail`), every partition of a topic in one scan
(:func:`ingested_partitions`: each scan plans the table's files anew, reading every
manifest, which dominates a failback plan on a table of many small files), or asks only
whether a row exists (:func:`holds_rows`, the first row found answers).
:class:`~ingestion.dr.scanned_rows.ScannedRows` holds one such scan per plan, bounded. Reads only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion.dr.align import RecordId
from ingestion.exceptions import FailoverRefusedError
from ingestion.table.schema import cluster_condition

if TYPE_CHECKING:
    import pyarrow as pa
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
    (``ingestion.dr.cluster_rows``: under MM2's identity naming one name is read on two)."""
    where = f"_kafka_partition = {key[1]} AND {condition}"
    return ingested_partitions(tables, key[0], where, cluster).get(key[1], [])


def ingested_partitions(
    tables: list[Table], topic: str, condition: str, cluster: str | None = None
) -> dict[int, Records]:
    """The records of ``topic`` matching ``condition`` per partition, from the data and
    quarantine tables (one scan each), in offset order; ``cluster``: see
    :func:`ingested_tail_where`."""
    rows: dict[int, dict[int, RecordId]] = {}
    scanned = matching_rows(tables, topic, condition, cluster)
    partitions = scanned.column("partition").to_pylist()
    offsets = scanned.column("offset").to_pylist()
    micros = scanned.column("micros").to_pylist()
    keys = scanned.column("key").to_pylist()
    for partition, offset, stamp, raw in zip(partitions, offsets, micros, keys, strict=True):
        rows.setdefault(int(partition), {})[int(offset)] = RecordId(int(stamp) // 1000, raw)
    return {partition: sorted(found.items()) for partition, found in rows.items()}


def matching_rows(
    tables: list[Table], topic: str, condition: str, cluster: str | None = None
) -> pa.Table:
    """The rows of ``topic`` matching ``condition`` (read on ``cluster``, if given) from the
    data and then the quarantine table, in the order read, as columns partition, offset,
    micros (the timestamp) and key (its bytes); refused when the table keeps keys decoded."""
    import pyarrow as pa

    found = []
    # Kafka topic names are [a-zA-Z0-9._-]: safe inside a quoted literal.
    row_filter = f"_kafka_topic = '{topic}' AND {condition}"
    fields = ("_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key")
    for table in tables:
        on_cluster = cluster_condition(table, cluster)
        if on_cluster is None:
            continue  # no row of this table was read on that cluster
        scanned = table.scan(row_filter=row_filter + on_cluster, selected_fields=fields).to_arrow()
        keys = scanned.column("_kafka_key")
        if pa.types.is_struct(keys.type) and keys.null_count < len(keys):
            raise FailoverRefusedError(
                f"{'.'.join(table.name())}: the table keeps the Kafka keys decoded "
                "(key_format: json), not their bytes, so its records cannot be matched with "
                "the replica's; a failover of this pipeline is not supported (reset its offsets "
                "on the replica explicitly instead); nothing was changed"
            )
        if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
            keys = keys.cast(pa.binary())  # UTF-8: the bytes str.encode() gives
        elif pa.types.is_large_binary(keys.type):
            keys = keys.cast(pa.binary())
        columns = {
            "partition": scanned.column("_kafka_partition").cast(pa.int64()),
            "offset": scanned.column("_kafka_offset").cast(pa.int64()),
            "micros": scanned.column("_kafka_timestamp").cast(pa.int64()),
            "key": keys,
        }
        found.append(pa.table(columns))
        del scanned
    if not found:
        return pa.table(
            {n: pa.array([], pa.int64()) for n in ("partition", "offset", "micros")}
            | {"key": pa.array([], pa.binary())}
        )
    return pa.concat_tables(found, promote_options="permissive")


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
