"""Reading a pipeline's state for checks and sensors, through the resources."""

from __future__ import annotations

from ingestion.health import PipelineState, read_state
from ingestion.spec import PipelineSpec
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def read_pipeline_state(
    spec: PipelineSpec, kafka: KafkaResource, iceberg: IcebergCatalogResource
) -> PipelineState:
    """The table's offsets and Kafka's metadata for ``spec``; consumes and commits nothing."""
    catalog = iceberg.load_catalog()
    table = catalog.load_table(spec.table) if catalog.table_exists(spec.table) else None
    consumer = kafka.get_consumer()
    try:
        return read_state(spec, table, kafka.get_admin_client(), consumer)
    finally:
        consumer.close()
