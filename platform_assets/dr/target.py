"""Where a switch goes, and how its plan reads to an operator: shared by the failover and
failback paths of :mod:`platform_assets.dr.failover`. Reads only."""

from __future__ import annotations

from dataclasses import dataclass

from ingestion.dr.failover import PartitionPlan
from ingestion.dr.mm2 import offset_syncs_topic
from ingestion.dr.replica_check import ReplicaTarget, count_records
from ingestion.exceptions import FailoverRefusedError
from ingestion.spec.pipeline import PipelineSpec
from ingestion.spec.replicas import ReplicaSpec
from platform_assets.route import PRIMARY, Route
from resources.kafka import KafkaResource

SYNCS_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class FailoverTarget:
    """Where a switch goes: the cluster's resource and MM2's naming of the flow into it."""

    target: ReplicaTarget
    kafka: KafkaResource
    syncs_topic: str | None


def failover_target(
    route: Route, spec: PipelineSpec, kafka: KafkaResource, to: str
) -> FailoverTarget:
    """The target ``to`` as seen from ``route`` (a failback reads the reverse flow)."""
    if to == route.cluster:
        failed_back = to == PRIMARY and route.spec.source_topics != spec.source_topics
        raise FailoverRefusedError(
            f"pipeline {spec.name!r} already reads from {to!r}; nothing to do"
            + (f" (to end the failback: platform complete-failback {spec.name})" * failed_back)
        )
    if to == PRIMARY:
        replica: ReplicaSpec = spec.replica(route.cluster)
        alias, policy = replica.failback_alias, replica.failback_replication_policy
        syncs: str | None = offset_syncs_topic(replica.source_alias)  # on the replica
    else:
        if route.cluster != PRIMARY:
            raise FailoverRefusedError(
                f"pipeline {spec.name!r} reads from replica {route.cluster!r}: fail back to "
                f"primary first (platform failover {spec.name} --to primary)"
            )
        if route.spec.source_topics != spec.source_topics:
            raise FailoverRefusedError(
                f"pipeline {spec.name!r} reads {route.spec.source_topics} on the primary since "
                f"its failback (reverse copies next to {spec.source_topics}); MM2 does not copy "
                "a reverse copy back to the replica, so a failover from this route is not "
                f"supported; nothing was changed. Complete the failback first (platform "
                f"complete-failback {spec.name} --reason ...), once its reverse copies are drained"
            )
        replica = spec.replica(to)
        alias, policy = replica.source_alias, replica.replication_policy
        syncs = offset_syncs_topic(replica.target_alias) if replica.target_alias else None
    try:
        resource = kafka.for_cluster(to)
    except ValueError as exc:
        raise FailoverRefusedError(f"pipeline {spec.name!r}: {exc}") from None
    target = ReplicaTarget(to, resource.client_config(), alias, policy)
    return FailoverTarget(target, resource, syncs)


def describe_plan(plans: list[PartitionPlan], note: bool = True) -> list[str]:
    """One line per partition: where it resumes on the target, and the evidence (``note``: and
    what the switch records of uncopied records, for a failover; a failback says it itself)."""
    lines = [
        f"{p.source_topic}[{p.partition}] at {p.source_next} -> {p.replica_topic}"
        f"[{p.partition}] from {p.replica_start} ({p.skipped} copies already ingested; "
        f"{p.anchor})" + (f"; {p.uncopied} ingested record(s) have no copy" if p.uncopied else "")
        for p in plans
    ]
    uncopied = sum(p.uncopied for p in plans)
    if uncopied and note:
        lines.append(
            f"note: the table ingested {uncopied} record(s) MirrorMaker 2 had not copied when "
            "the source went down. The switch records them: if MM2's forward flow copies them "
            "when the source comes back, runs skip each copy that is byte for byte one of "
            "them, reading the original on the source to compare (a run that meets one while "
            "the source does not answer refuses, committing nothing)"
        )
    return lines


def describe_local_topics(
    spec: PipelineSpec, names: dict[str, str], target: ReplicaTarget
) -> list[str]:
    """A note per topic the target has under a spec topic's own name while the route reads
    MM2's copy (``default`` naming) and it holds records: the route does not read it, and the
    replica check fails while producers write there (``ingestion.dr.replica_check``)."""
    local = [topic for topic in spec.source_topics if names.get(topic, topic) != topic]
    counts = count_records(target.kafka_config, local, SYNCS_TIMEOUT_S) if local else {}
    return [
        f"note: {target.name!r} also has its own topic {topic!r} (about {count} record(s)); the "
        f"route reads MM2's copy {names[topic]!r}, not it: producers that fail over must write "
        f"to {names[topic]!r} (or use replication_policy: identity)"
        for topic, count in sorted(counts.items())
    ]
