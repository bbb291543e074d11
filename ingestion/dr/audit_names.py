"""The name families of the full audit's cross-name check (``ingestion.audit.names``): each
spec topic with every name MirrorMaker 2 gives it under the pipeline's replicas."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion.dr.mm2 import replica_topic

if TYPE_CHECKING:
    from ingestion.spec.pipeline import PipelineSpec


def name_families(spec: PipelineSpec) -> list[frozenset[str]]:
    """Per spec topic with replicas, every name it is read under: itself, its copy on each
    replica, and the reverse copies a failback reads.

    Example:
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> spec = parse_pipeline_spec({"name": "p", "topic": "orders", "table": "n.t",
        ...     "consumer_group_id": "g", "value_format": "raw",
        ...     "replicas": [{"name": "dr", "source_alias": "primary"}]})
        >>> sorted(name_families(spec)[0])
        ['orders', 'primary.orders']
    """
    families = []
    for topic in spec.source_topics if spec.topic_pattern is None else []:
        names = {topic}
        for replica in spec.replicas:
            copy = replica_topic(topic, replica.source_alias, replica.replication_policy)
            back = (replica.failback_alias, replica.failback_replication_policy)
            names |= {copy, replica_topic(copy, *back), replica_topic(topic, *back)}
        if len(names) > 1:
            families.append(frozenset(names))
    return families
