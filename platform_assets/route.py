"""Which cluster a pipeline reads now, and under which topic names: the table says.

After a failover (``platform failover``) the table's newest switch names the cluster
(:func:`~ingestion.dr.switch.active_cluster`) and the topics read there (after a failback,
the reverse copies and the origin topics); the ingestion asset, the lag sensor, the checks and
the CLI all read through :func:`active_route`, so they follow the switch without a
configuration change; after a failback's completion (``platform complete-failback``) they read
the spec's topics on the primary again. Reads only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.route import active_cluster, active_origins, active_topics
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

PRIMARY = "primary"


@dataclass(frozen=True)
class Route:
    """The cluster a pipeline reads (``primary`` or a replica's name), the spec as it reads
    there (topics under MM2's names) and the Kafka resource of that cluster."""

    cluster: str
    spec: PipelineSpec
    kafka: KafkaResource


def active_route(
    spec: PipelineSpec, kafka: KafkaResource, iceberg: IcebergCatalogResource
) -> Route:
    """The route the table records for ``spec`` (``primary`` before any switch).

    Example:
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> spec = parse_pipeline_spec({"name": "p", "topic": "orders", "table": "n.t",
        ...     "consumer_group_id": "g", "value_format": "raw"})
        >>> kafka = KafkaResource(bootstrap_servers="b:9092")
        >>> active_route(spec, kafka, IcebergCatalogResource(state_dir="unused")).cluster
        'primary'
    """
    if not spec.replicas:
        return Route(PRIMARY, spec, kafka)
    catalog = iceberg.load_catalog()
    if not catalog.table_exists(spec.table):
        return Route(PRIMARY, spec, kafka)
    table = catalog.load_table(spec.table)
    cluster = active_cluster(table, spec.consumer_group_id)
    if cluster is None:
        return Route(PRIMARY, spec, kafka)
    names = active_topics(table, spec.consumer_group_id) or {}
    topics = [names.get(topic, topic) for topic in spec.source_topics]
    # A failback to the primary reads the origin topics again (their unreplicated tail and what
    # producers write there since), next to the reverse copies: ingestion.dr.failback.origin.
    topics += [t for t in active_origins(table, spec.consumer_group_id) if t not in topics]
    moved = spec.model_copy(update={"topic": None, "topics": topics})
    return Route(cluster, moved, kafka.for_cluster(cluster))
