"""The replica readiness check of each replica a pipeline names, read through the resources.

One asset check per replica (``replica_<name>_ready``), evaluated with the table's other
checks (``platform_assets.ingest.checks``): the engine's pure check
(:func:`~ingestion.dr.replica_check.check_replica`) on facts read from both clusters. Before a
failover it judges the flow primary -> replica; while the pipeline reads from that replica,
the way back (the reverse flow into the primary, what a failback needs). Reads only.
"""

from __future__ import annotations

import dataclasses
import time

from ingestion.dr.failback.flow_loop import failback_flows, find_looped_records
from ingestion.dr.replica_check import (
    ReplicaFacts,
    ReplicaTarget,
    check_replica,
    count_records,
    read_replica_facts,
)
from ingestion.health.checks import Finding, failed, skipped
from ingestion.spec.pipeline import PipelineSpec
from ingestion.spec.replicas import ReplicaSpec
from platform_assets.route import PRIMARY, Route, active_route
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def replica_finding(
    spec: PipelineSpec,
    replica: ReplicaSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    now_ms: int | None = None,
) -> Finding:
    """Is ``replica`` ready to take the pipeline (or, while it does, to give it back)?"""
    from confluent_kafka import KafkaException

    route = active_route(spec, kafka, iceberg)
    try:
        if route.cluster == PRIMARY:
            cluster = kafka.for_cluster(replica.name)
            alias, policy = replica.source_alias, replica.replication_policy
            target = ReplicaTarget(replica.name, cluster.client_config(), alias, policy)
        elif route.cluster == replica.name:
            alias, policy = replica.failback_alias, replica.failback_replication_policy
            target = ReplicaTarget(PRIMARY, kafka.client_config(), alias, policy)
        else:
            return skipped(
                f"pipeline {spec.name!r} reads from replica {route.cluster!r}: replica "
                f"{replica.name!r} is checked again once it fails back to primary"
            )
    except ValueError as exc:  # the replica is not in the platform configuration
        return failed("ERROR", f"pipeline {spec.name!r}: {exc}")
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    try:
        facts = read_replica_facts(
            route.kafka.client_config(),
            target,
            spec.consumer_group_id,
            # On the primary MM2 copies the origin topics (after a failback the route also
            # reads the reverse copies, which the forward flow does not copy back).
            spec.source_topics if route.cluster == PRIMARY else route.spec.source_topics,
            now_ms,
            timeout_s=10.0,
        )
        facts = _with_route_facts(facts, spec, route, iceberg)
    except KafkaException as exc:
        return failed(
            "ERROR",
            f"replica check of {target.name!r} for {spec.name!r}: a cluster did not answer "
            f"({exc.args[0].name()}): check replicas.{replica.name} in the platform "
            "configuration and that both clusters are up",
        )
    return check_replica(facts, replica.max_checkpoint_age_seconds)


def _with_route_facts(
    facts: ReplicaFacts, spec: PipelineSpec, route: Route, iceberg: IcebergCatalogResource
) -> ReplicaFacts:
    """Add what the route in force misses or reads twice: the replica's own topics of the
    spec's names while failed over under MM2's default naming, and records looping back
    through a reverse copy after a failback (``ingestion.dr.replica_check``)."""
    config = route.kafka.client_config()
    if route.cluster != PRIMARY:
        local = [t for t in spec.source_topics if t not in route.spec.source_topics]
        unread = count_records(config, local, timeout_s=10.0) if local else {}
        return dataclasses.replace(facts, unread_local=unread)
    catalog = iceberg.load_catalog()
    if not catalog.table_exists(spec.table):
        return facts
    flows = failback_flows(catalog.load_table(spec.table), spec.consumer_group_id)
    if flows is None:
        return facts
    return dataclasses.replace(facts, looped=find_looped_records(config, flows))


def replica_config_problems(
    specs: list[PipelineSpec], kafka: KafkaResource, timeout_s: float = 10.0
) -> list[str]:
    """What ``platform validate`` reports about replicas: a pipeline naming a replica the
    configuration lacks, or a configured replica cluster that does not answer.

    Example:
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> spec = parse_pipeline_spec({"name": "p", "topics": ["orders"], "table": "n.t",
        ...     "consumer_group_id": "g", "value_format": "raw",
        ...     "replicas": [{"name": "dr", "source_alias": "primary"}]})
        >>> replica_config_problems([spec], KafkaResource(bootstrap_servers="b:9092"))[0][:46]
        "pipeline 'p': replicas[0].name: replica 'dr' i"
    """
    from confluent_kafka import KafkaException

    problems = []
    for spec in specs:
        for index, replica in enumerate(spec.replicas):
            if replica.name not in kafka.replicas:
                problems.append(
                    f"pipeline {spec.name!r}: replicas[{index}].name: replica {replica.name!r} "
                    f"is not in the platform configuration: add replicas.{replica.name} "
                    "(bootstrap_servers, properties) to it"
                )
    for name in sorted(kafka.replicas):
        try:
            kafka.for_cluster(name).get_admin_client().list_topics(timeout=timeout_s)
        except KafkaException as exc:
            problems.append(
                f"replicas.{name}: the replica cluster did not answer within {timeout_s:.0f} s "
                f"({exc.args[0].name()}): check its bootstrap_servers and properties"
            )
    return problems
