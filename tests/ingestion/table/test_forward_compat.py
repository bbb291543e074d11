"""A table a later release touched keeps ingesting on this one (rolling back a deploy).

A later release may add an optional Kafka metadata column to every table on its first run, as
this one added ``_kafka_cluster`` (docs/cluster-column.md). This engine does not write such a
column; its rows, data and dead letters, land with it null, and nothing is lost or read twice.
The column here is a stand-in (``_kafka_leader_epoch``). Real broker, real catalog, the engine
in process.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyiceberg.types import IntegerType

from ingestion.pipeline.run import run_pipeline
from ingestion.table.schema import load_or_create_quarantine_table
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import records

pytestmark = pytest.mark.integration


def test_a_table_with_a_later_releases_kafka_column_keeps_ingesting(
    kafka: KafkaResource,
    catalog_resource: IcebergCatalogResource,
    new_pipeline: Any,
    ledger_producer: LedgerProducer,
) -> None:
    topic, spec = new_pipeline("fwd_compat", produce=10, errors_tolerance="all")
    catalog = catalog_resource.load_catalog()
    run_pipeline(spec, kafka.client_config(), catalog, None, kafka.get_cluster_id())
    quarantine = load_or_create_quarantine_table(catalog, spec)
    for table in (catalog.load_table(spec.table), quarantine):  # what the later release does
        with table.update_schema() as update:
            update.add_column("_kafka_leader_epoch", IntegerType())
    ledger_producer.produce(topic, [*records(5, first=10), (b"k15", b"{not json", None)])
    report = run_pipeline(spec, kafka.client_config(), catalog, None, kafka.get_cluster_id())
    assert (report.records, report.quarantined) == (5, 1)
    rows = catalog.load_table(spec.table).scan().to_arrow()
    assert sorted(rows.column("_kafka_offset").to_pylist()) == list(range(15))  # each once
    assert set(rows.column("_kafka_leader_epoch").to_pylist()) == {None}
    assert set(rows.column("_kafka_cluster").to_pylist()) == {"primary"}
    bad = catalog.load_table(spec.quarantine_table).scan().to_arrow()
    assert bad.column("_kafka_offset").to_pylist() == [15]
