"""Reading a pipeline's state for checks, sensors and the CLI, through the resources."""

from __future__ import annotations

from ingestion.health.state import PipelineState, read_state
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.route import active_route
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def read_pipeline_state(
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    with_oldest: bool = False,
) -> PipelineState:
    """The table's offsets and Kafka's metadata for ``spec`` (with ``with_oldest``, also the
    timestamp of each lagging partition's oldest uncommitted record); commits nothing.

    Read on the pipeline's active route: after a failover, the replica and its topic names.
    """
    route = active_route(spec, kafka, iceberg)
    spec, kafka = route.spec, route.kafka
    catalog = iceberg.load_catalog()
    table = catalog.load_table(spec.table) if catalog.table_exists(spec.table) else None
    consumer = kafka.get_consumer()
    try:
        return read_state(
            spec,
            table,
            kafka.get_admin_client(),
            consumer,
            kafka.client_config() if with_oldest else None,
        )
    finally:
        consumer.close()
