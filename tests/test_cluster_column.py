"""Rows record the cluster they were read on (``_kafka_cluster``, docs/cluster-column.md).

A table created before the column gains it on its first run, as a metadata-only schema change
after its other Kafka columns; its older rows read null, which every reader takes for
``primary``, and both audits pass over old and new rows alike. Real broker, real SQL catalog,
real engine runs; the old table is written as the engine wrote it before the column (its schema,
its rows, its commit's offsets).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import orjson
import pyarrow as pa
import pytest
from confluent_kafka import TopicCollection
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from ingestion.audit import audit_pipeline
from ingestion.offsets import TopicOffsets, commit_properties
from ingestion.run import run_pipeline
from ingestion.tables import (
    CLUSTER_COLUMN,
    TABLE_PROPERTIES,
    build_quarantine_schema,
    build_schema,
)
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import NewPipeline, records


def without_cluster(schema: Schema) -> Schema:
    """The schema as the engine built it before ``_kafka_cluster``."""
    return Schema(*(f for f in schema.fields if f.name != CLUSTER_COLUMN))


def test_new_tables_have_the_column_after_the_other_kafka_columns() -> None:
    from tests.support.pipelines import make_spec

    spec = make_spec("orders", "cl_schema", headers=True)
    names = [f.name for f in build_schema(spec).fields]
    assert names[-3:] == ["_kafka_key", "_kafka_headers", CLUSTER_COLUMN]
    quarantine = [f.name for f in build_quarantine_schema(spec).fields]
    assert quarantine[quarantine.index("_kafka_key") + 1] == CLUSTER_COLUMN
    assert not build_schema(spec).find_field(CLUSTER_COLUMN).required


@pytest.mark.integration
def test_a_table_created_before_the_column_gains_it_and_old_rows_audit_as_primary(
    new_pipeline: NewPipeline,
    kafka: KafkaResource,
    catalog_resource: IcebergCatalogResource,
    ledger: Ledger,
    ledger_producer: LedgerProducer,
) -> None:
    topic, spec = new_pipeline(
        "cl_upgrade", produce=5, errors_tolerance="all", in_process_max_records=10_000
    )
    catalog = catalog_resource.load_catalog()
    catalog.create_namespace_if_not_exists("tests")
    table = catalog.create_table(
        spec.table, schema=without_cluster(build_schema(spec)), properties=TABLE_PROPERTIES
    )
    quarantine = catalog.create_table(
        spec.quarantine_table,
        schema=without_cluster(build_quarantine_schema(spec)),
        properties=TABLE_PROPERTIES,
    )
    # The old engine's first commit: rows without the column, and the offsets they reach.
    admin = kafka.get_admin_client()
    topic_id = str(admin.describe_topics(TopicCollection([topic]))[topic].result(10).topic_id)
    old = []
    for entry in sorted(ledger.entries, key=lambda e: e.offset):
        value = orjson.loads(entry.value or b"{}")
        old.append({
            "id": value["id"], "name": value["name"], "amount": Decimal(value["amount"]),
            "ts": dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC), "_kafka_topic": topic,
            "_kafka_partition": 0, "_kafka_offset": entry.offset,
            "_kafka_timestamp": dt.datetime.fromtimestamp(entry.timestamp_ms / 1000, dt.UTC),
            "_kafka_key": (entry.key or b"").decode(),
        })  # fmt: skip
    properties = commit_properties(
        group_id=spec.consumer_group_id, offsets={topic: TopicOffsets(topic_id, {0: 5})},
        commit_id="old-engine", cluster_id=kafka.get_cluster_id(), pipeline=spec.name,
        records=5,
    )  # fmt: skip
    table.append(
        pa.Table.from_pylist(old, schema=schema_to_pyarrow(table.schema())),
        snapshot_properties=properties,
    )
    before = quarantine.metadata.current_schema_id, table.metadata.current_snapshot_id

    ledger_producer.produce(topic, [*records(3, first=5), (b"bad", b"not json", None)])
    report = run_pipeline(spec, kafka.client_config(), catalog, None, kafka.get_cluster_id())
    assert (report.records, report.quarantined) == (3, 1)

    table = catalog.load_table(spec.table)
    names = [f.name for f in table.schema().fields]
    assert names[names.index("_kafka_key") + 1] == CLUSTER_COLUMN  # after the Kafka columns
    rows = table.scan(selected_fields=("_kafka_offset", CLUSTER_COLUMN)).to_arrow()
    by_offset = dict(
        zip(
            rows.column("_kafka_offset").to_pylist(),
            rows.column(CLUSTER_COLUMN).to_pylist(),
            strict=True,
        )
    )
    assert by_offset == {0: None, 1: None, 2: None, 3: None, 4: None,
                         5: "primary", 6: "primary", 7: "primary"}  # fmt: skip
    quarantine = catalog.load_table(spec.quarantine_table)
    assert quarantine.metadata.current_schema_id != before[0]  # it gained the column too
    dead = quarantine.scan(selected_fields=("_kafka_offset", CLUSTER_COLUMN)).to_arrow()
    assert dead.to_pylist() == [{"_kafka_offset": 8, CLUSTER_COLUMN: "primary"}]
    # Adding the column rewrote no file and made no snapshot: the old commit is the parent.
    head = table.current_snapshot()
    assert head is not None
    assert head.parent_snapshot_id == before[1]

    audit = audit_pipeline(spec, catalog, kafka.client_config(), full=True)
    assert audit is not None
    assert audit.full is not None
    assert audit.commits.ok, audit.commits.findings  # each commit recounted in Kafka
    assert len(audit.commits.recounted) == 2  # the old engine's commit and the new run's
    assert audit.full.ok, audit.full.summary()  # every row's coordinates, old ones too
    assert (audit.full.rows, audit.full.quarantined) == (8, 1)
