"""Target and quarantine tables: schemas, partition specs, create-if-absent.

User columns come first, then the Kafka metadata columns every row carries (the oracle's
coordinates): ``_kafka_topic, _kafka_partition, _kafka_offset, _kafka_timestamp, _kafka_key``,
``_kafka_headers`` when asked, and ``_kafka_cluster``: the name in the platform configuration
of the cluster the row was read on (``primary`` or a replica's name; docs/cluster-column.md).
A table created before that column gains it on its first run (:func:`add_cluster_column`, a
metadata-only schema change); its older rows read null, which every reader takes for
``primary``.

A ``mode: upsert`` table (R57) also has the change columns between the user's and the
Kafka ones: ``_cdc_op`` (``c``, ``u`` or ``r``: how the row's last change reached it),
``_cdc_source_ts_ms`` (when the database made it, Debezium's ``source.ts_ms``) and ``_cdc_lsn``
(its log position where the source has one). Its key fields are required and are the schema's
identifier fields, and the table is created sorted by them (copy-on-write finds a key's file
by the files' bounds: ingestion/table/upsert.py).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ingestion.exceptions import PipelineSpecError
from ingestion.spec.pipeline import FieldSpec, PipelineSpec, key_fields_problem
from ingestion.spec.types import parse_type_string, to_iceberg

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.sorting import SortOrder
    from pyiceberg.types import IcebergType, NestedField

CLUSTER_COLUMN = "_kafka_cluster"
PRIMARY = "primary"  # the pipeline's own cluster: what a null _kafka_cluster means


def labels_cluster(schema: Schema) -> bool:
    """Whether rows of ``schema`` record the cluster they were read on (``_kafka_cluster``; a
    table created before the column gains it on its next run)."""
    return any(field.name == CLUSTER_COLUMN for field in schema.fields)


def has_cluster_column(table: Table) -> bool:
    """Whether the table's schema has ``_kafka_cluster`` (a table created before it gains it on
    its next run)."""
    return labels_cluster(table.schema())


def cluster_condition(table: Table, cluster: str | None) -> str | None:
    """The row-filter clause (`` AND ...``) selecting ``table``'s rows read on ``cluster``: ""
    for every row (``cluster`` None, or ``primary`` on a table without the column: all its rows
    are the primary's); None when no row can be (another cluster, no column).

    Example:
        >>> import tempfile
        >>> from pyiceberg.catalog.sql import SqlCatalog
        >>> from pyiceberg.schema import Schema
        >>> from pyiceberg.types import NestedField, StringType
        >>> where = tempfile.mkdtemp()
        >>> catalog = SqlCatalog("c", uri=f"sqlite:///{where}/c.db", warehouse=f"file://{where}")
        >>> catalog.create_namespace("n")
        >>> old = catalog.create_table("n.t", Schema(NestedField(1, "v", StringType())))
        >>> cluster_condition(old, "primary"), cluster_condition(old, "dr")
        ('', None)
        >>> with old.update_schema() as update:
        ...     update = update.add_column(CLUSTER_COLUMN, StringType())
        >>> cluster_condition(old, "dr")
        " AND _kafka_cluster = 'dr'"
    """
    if cluster is None:
        return ""
    if not has_cluster_column(table):
        return "" if cluster == PRIMARY else None
    # Cluster names are the platform configuration's keys ([a-zA-Z0-9_-]): safe quoted.
    if cluster == PRIMARY:
        return f" AND ({CLUSTER_COLUMN} IS NULL OR {CLUSTER_COLUMN} = '{PRIMARY}')"
    return f" AND {CLUSTER_COLUMN} = '{cluster}'"


_CLUSTER_DOC = "Kafka cluster the record was read on (platform configuration name); null: primary"
TABLE_PROPERTIES = {"format-version": "2", "write.parquet.compression-codec": "zstd"}


def parse_type(name: str, ids: Iterator[int] | None = None) -> IcebergType:
    """Return the Iceberg type for a spec type name such as ``long``, ``decimal(12,2)`` or
    ``struct<id:long,tags:list<string>>`` (nested field ids drawn from ``ids``).

    Example:
        >>> parse_type("decimal(12, 2)")
        DecimalType(precision=12, scale=2)
        >>> parse_type("list<long not null>", itertools.count(5))
        ListType(type='list', element_id=5, element_type=LongType(), element_required=True)
    """
    return to_iceberg(parse_type_string(name), ids if ids is not None else itertools.count(1))


def coordinate_columns(key_type: IcebergType) -> list[tuple[str, IcebergType, bool]]:
    """(name, type, required) of the Kafka metadata columns every row carries."""
    from pyiceberg.types import IntegerType, LongType, StringType, TimestamptzType

    return [
        ("_kafka_topic", StringType(), True),
        ("_kafka_partition", IntegerType(), True),
        ("_kafka_offset", LongType(), True),
        ("_kafka_timestamp", TimestamptzType(), False),
        ("_kafka_key", key_type, False),
    ]


def cluster_column() -> tuple[str, IcebergType, bool]:
    """(name, type, required) of ``_kafka_cluster``, the last Kafka column of a row."""
    from pyiceberg.types import StringType

    return (CLUSTER_COLUMN, StringType(), False)


def key_type(spec: PipelineSpec, ids: Iterator[int]) -> IcebergType:
    """The ``_kafka_key`` column's type: binary, string, or a struct of ``key_schema``."""
    from pyiceberg.types import BinaryType, NestedField, StringType, StructType

    if spec.key_format == "json":
        fields: list[FieldSpec] = spec.key_schema or []
        return StructType(
            *(NestedField(next(ids), f.name, parse_type(f.type, ids), f.required) for f in fields)
        )
    return StringType() if spec.key_format == "string" else BinaryType()


def headers_type(ids: Iterator[int]) -> IcebergType:
    """``list<struct<key:string not null, value:binary>>``: Kafka headers are ordered and may
    repeat a key, so a list of pairs, not a map."""
    return parse_type("list<struct<key:string not null, value:binary> not null>", ids)


def build_schema(spec: PipelineSpec, derived: Schema | None = None) -> Schema:
    """Return the table schema: declared (or ``derived``, e.g. from Avro) fields, metadata last.

    A ``raw`` pipeline without a declared schema stores the value bytes in a ``value`` column.
    """
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        NestedField,
    )

    ids = itertools.count(len(spec.schema_fields or []) + 1)  # nested ids after the columns
    keys = spec.key_fields or []
    if spec.schema_fields:
        fields = [
            NestedField(
                i, f.name, parse_type(f.type, ids), required=f.required or f.name in keys, doc=f.doc
            )
            for i, f in enumerate(spec.schema_fields, start=1)
        ]
    elif derived is not None:
        fields = _derived_fields(spec, derived)
    elif spec.value_format == "raw":
        fields = [NestedField(1, "value", BinaryType(), required=False)]
    else:
        raise ValueError(f"pipeline {spec.name!r}: no declared or derived schema")
    first = max(Schema(*fields).highest_field_id, len(fields)) + 1
    ids = itertools.count(first + 16)  # ids of the metadata columns' nested fields
    metadata = change_columns() if spec.mode == "upsert" else []
    metadata += coordinate_columns(key_type(spec, ids))
    if spec.headers:
        metadata.append(("_kafka_headers", headers_type(ids), False))
    metadata.append(cluster_column())
    fields += [
        NestedField(first + i, name, kind, required=required)
        for i, (name, kind, required) in enumerate(metadata)
    ]
    identifiers = [f.field_id for f in fields if f.name in keys]
    return Schema(*fields, identifier_field_ids=identifiers)


def _derived_fields(spec: PipelineSpec, derived: Schema) -> list[NestedField]:
    """``derived``'s fields (e.g. from the registry). An upsert pipeline's key fields are
    checked as a declared schema's are at load, and made required; its other fields optional:
    a change written under an older version of the row (before a ``NOT NULL`` column was
    added) must still apply, and an Avro record is read with its writer's schema (no reader
    defaults)."""
    from pyiceberg.types import NestedField

    keys = spec.key_fields or []
    problem = key_fields_problem(keys, {f.name: str(f.field_type) for f in derived.fields})
    if problem:
        raise PipelineSpecError(
            f"pipeline {spec.name!r}: {problem} (the schema derived from the registry has "
            f"{[f.name for f in derived.fields]}): fix key_fields, or declare schema: [...]"
        )
    if spec.mode != "upsert":
        return list(derived.fields)
    return [
        NestedField(f.field_id, f.name, f.field_type, required=f.name in keys, doc=f.doc)
        for f in derived.fields
    ]


def change_columns() -> list[tuple[str, IcebergType, bool]]:
    """(name, type, required) of an upsert table's change columns (see the module docstring)."""
    from pyiceberg.types import LongType, StringType

    from ingestion.formats.debezium import LSN, OP, SOURCE_TS_MS

    return [(OP, StringType(), False), (SOURCE_TS_MS, LongType(), False), (LSN, LongType(), False)]


def build_sort_order(spec: PipelineSpec, schema: Schema) -> SortOrder:
    """An upsert table's sort order: its key fields, ascending (others: unsorted)."""
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortField, SortOrder
    from pyiceberg.transforms import IdentityTransform

    if spec.mode != "upsert":
        return UNSORTED_SORT_ORDER
    return SortOrder(
        *[
            SortField(source_id=schema.find_field(name).field_id, transform=IdentityTransform())
            for name in spec.key_fields or []
        ]
    )


def build_partition_spec(spec: PipelineSpec, schema: Schema) -> PartitionSpec:
    """Return the partition spec declared by ``partition_by``."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import parse_transform

    fields = []
    for i, part in enumerate(spec.partition_by):
        transform = parse_transform(part.transform)
        source = schema.find_field(part.source)
        suffix = "" if part.transform == "identity" else "_" + re.sub(r"\W", "", part.transform)
        name = part.name or f"{part.source}{suffix}"
        fields.append(PartitionField(source.field_id, 1000 + i, transform, name))
    return PartitionSpec(*fields)


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    """Create ``namespace`` unless it exists; safe when several writers create it at once.

    ``create_namespace_if_not_exists`` checks, then inserts: a stream worker starting many
    lanes on a fresh catalog loses that race (the SQL catalog raises SQLAlchemy's
    ``IntegrityError`` on ``iceberg_namespace_properties``; measured with 10 lanes on `make dev`:
    two lanes failed and restarted 30 s later). Losing it is success when the namespace is there.
    """
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception:
        if not catalog.namespace_exists(namespace):
            raise


def load_or_create_table(
    catalog: Catalog, spec: PipelineSpec, derived: Schema | None = None
) -> Table:
    """Load the pipeline's table, creating it (and its namespace) from the spec if absent."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return add_cluster_column(catalog.load_table(spec.table))
    except NoSuchTableError:
        pass
    schema = build_schema(spec, derived)
    ensure_namespace(catalog, spec.table.rsplit(".", 1)[0])
    properties = {
        **TABLE_PROPERTIES,
        "write.target-file-size-bytes": str(spec.target_file_size_bytes),
    }
    return catalog.create_table_if_not_exists(
        spec.table,
        schema=schema,
        partition_spec=build_partition_spec(spec, schema),
        sort_order=build_sort_order(spec, schema),
        properties=properties,
    )


def build_quarantine_schema(spec: PipelineSpec) -> Schema:
    """The quarantine table: source coordinates, key and raw bytes, and the error."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        NestedField,
        StringType,
    )

    columns = [
        *coordinate_columns(BinaryType()),
        cluster_column(),
        ("value", BinaryType(), False),
        ("error_class", StringType(), True),
        ("error_message", StringType(), True),
        ("pipeline", StringType(), True),
        ("commit_id", StringType(), True),
    ]
    return Schema(
        *(NestedField(i, n, t, required=r) for i, (n, t, r) in enumerate(columns, start=1))
    )


def load_or_create_quarantine_table(catalog: Catalog, spec: PipelineSpec) -> Table:
    """Load the pipeline's quarantine (dead-letter) table, creating it if absent."""
    from pyiceberg.exceptions import NoSuchTableError

    identifier = spec.quarantine_table
    try:
        return add_cluster_column(catalog.load_table(identifier))
    except NoSuchTableError:
        pass
    ensure_namespace(catalog, identifier.rsplit(".", 1)[0])
    return catalog.create_table_if_not_exists(
        identifier, schema=build_quarantine_schema(spec), properties=TABLE_PROPERTIES
    )


def add_cluster_column(table: Table, attempts: int = 3) -> Table:
    """Give a table created before ``_kafka_cluster`` the column, after its other Kafka
    columns; return the table, refreshed.

    Delivery: one metadata-only schema change (no file rewritten, no snapshot, so no run's
    compare-and-set of the offsets is disturbed); its older rows read null (``primary``). Two
    runs racing to add it: one commits, the other finds the column on refresh. Safe to retry.
    """
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.types import StringType

    for attempt in range(attempts):
        if labels_cluster(table.schema()):
            return table
        last = [f.name for f in table.schema().fields if f.name.startswith("_kafka_")][-1]
        try:
            with table.update_schema() as update:
                update.add_column(CLUSTER_COLUMN, StringType(), doc=_CLUSTER_DOC)
                update.move_after(CLUSTER_COLUMN, last)
        except CommitFailedException:
            if attempt == attempts - 1:
                raise
            table.refresh()
    return table
