"""Switch a pipeline to another cluster: the failover commit, and which cluster is active.

The switch is an operator action committed like a reset (compare-and-set on the offsets it was
planned from, :func:`~ingestion.ops.action.commit_action`): one snapshot replaces the group's
offsets for the source topics with the planned offsets of their copies on the replica, under
the replica's cluster id, and records the plan (``kafka.failover-plan``: per partition the
source position, the replica position, the anchor and the copies skipped), the target
(``kafka.failover-to``), who and why. From then on the table says which cluster the pipeline
reads: :func:`active_cluster` (the newest switch in the current ancestry; none means the
pipeline's own cluster). Runs read there; their commits carry that cluster's id, so the
planner's cluster check holds. A failback to the pipeline's own cluster also puts the origin
topics back at their planned positions (``kafka.failover-origin``,
``ingestion.dr.failback.origin``): the route then reads the reverse copies and the origin topics,
until the failback's completion ends it (``ingestion.dr.failback.complete``).

Delivery: exactly once across the switch when the plan's alignment holds (see
``ingestion.dr.failover``). A run in flight when the switch commits aborts at its own commit (its
offsets moved); an ambiguous catalog error is reconciled by the switch's commit id.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import orjson

from ingestion.dr.failback.lost import FAILOVER_SOURCE_LOST
from ingestion.dr.failback.origin import FAILOVER_PLAN, OriginPlan
from ingestion.dr.failover import PartitionPlan
from ingestion.dr.late_copies.guard import Entries, read_guard, uncopied_property
from ingestion.dr.mm2 import replica_topic
from ingestion.dr.replica_check import ReplicaTarget
from ingestion.exceptions import FailoverRefusedError
from ingestion.ops.action import ActionCommit, ActionOutcome, commit_action, refuse_active_runs
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table import offsets as props
from ingestion.table.offsets import OffsetMap, TopicOffsets, find_committed_state
from ingestion.table.route import FAILOVER_ORIGIN, FAILOVER_TOPICS, PRIMARY

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient
    from pyiceberg.catalog import Catalog

FAILOVER_TO = props.FAILOVER_TO


def spec_on_replica(spec: PipelineSpec, target: ReplicaTarget) -> PipelineSpec:
    """The pipeline as it reads on ``target``: its topics under MM2's names.

    Example:
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> spec = parse_pipeline_spec({"name": "p", "topic": "orders", "table": "n.t",
        ...     "consumer_group_id": "g", "value_format": "raw"})
        >>> spec_on_replica(spec, ReplicaTarget("dr", {}, "primary")).source_topics
        ['primary.orders']
    """
    if spec.topic_pattern is not None:
        raise FailoverRefusedError(
            f"pipeline {spec.name!r} reads a topic pattern; list its topics (topics: [...]) "
            "to fail it over"
        )
    policy = target.replication_policy
    renamed = [replica_topic(t, target.source_alias, policy) for t in spec.source_topics]
    return spec.model_copy(update={"topic": None, "topics": renamed})


def _topic_id(admin: AdminClient, topic: str, pipeline: str) -> str:
    """The replica topic's id, stored with its offsets like any topic's (a recreated copy is
    then caught by the planner's topic-id check)."""
    from confluent_kafka import KafkaException, TopicCollection

    try:
        return str(admin.describe_topics(TopicCollection([topic]))[topic].result(30).topic_id)
    except KafkaException as exc:
        raise FailoverRefusedError(
            f"pipeline {pipeline!r}: replica topic {topic!r} cannot be described ({exc}); "
            "nothing was changed"
        ) from exc


def apply_failover(
    catalog: Catalog,
    spec: PipelineSpec,
    plans: list[PartitionPlan],
    planned_from: OffsetMap,
    target: ReplicaTarget,
    target_cluster_id: str,
    replica_admin: AdminClient,
    requested_by: str,
    reason: str,
    active_runs: int = 0,
    spec_topics: dict[str, str] | None = None,
    origin: list[OriginPlan] | None = None,
    source: str = PRIMARY,
    assertion: dict[str, object] | None = None,
    read: Entries | None = None,
) -> ActionOutcome:
    """Commit the switch to ``target`` with ``plans``; the table then reads there.

    ``spec_topics`` (``{spec topic: topic read on the target}``) is recorded so that later runs,
    checks and a failback know the names (:func:`active_topics`). ``origin`` (a failback to the
    pipeline's own cluster) adds the origin topics at their planned positions, recorded in
    ``kafka.failover-origin`` (:func:`active_origins`). The records the table ingested from
    ``source`` (the cluster left) that the plans found uncopied are recorded in the same
    transaction, for the runs on the new route (``ingestion.dr.late_copies.guard``). ``assertion``:
    what the operator accepted with ``--source-lost`` on a failback (``kafka.failover-source-lost``
    on the switch: the replica lost, and per partition how many records the table ingested beyond
    the reverse copy; ``ingestion.dr.failback.lost``). ``read``: the guard's entries for the origin
    records such a failback reads (``ingestion.dr.late_copies.origin``).

    Raises:
        CommitConflictError: a run is in progress, or the offsets moved since the plan.
    """
    refuse_active_runs(spec, active_runs, "failing over")
    group = spec.consumer_group_id
    table = catalog.load_table(spec.table)
    current = find_committed_state(table, group)
    if current is None or current.offsets != planned_from:
        raise FailoverRefusedError(
            f"pipeline {spec.name!r}: the offsets changed since the failover was planned (by "
            f"{current.describe() if current else 'a commit that removed them'}); nothing was "
            "changed. Plan it again. If the pipeline streams, its commits every few seconds "
            "will keep beating a plan: run the failover as the Dagster job `failover`, which "
            "hands the stream over (it stops it, acts, and the stream sensor starts the next), "
            "or stop the stream sensor and the stream run first (docs/operate.md)"
        )
    planned = {(t, p) for t, o in planned_from.items() for p in o.next_offsets}
    covered = {(plan.source_topic, plan.partition) for plan in plans}
    if covered != planned:
        raise FailoverRefusedError(
            f"pipeline {spec.name!r}: the failover plan covers {sorted(covered)} but the table "
            f"has offsets for {sorted(planned)}; a partition left out would be read again from "
            "the replica's start. Plan it again; nothing was changed"
        )
    next_offsets: dict[str, dict[int, int]] = {}
    topic_ids: dict[str, str] = {}
    for plan in plans:
        next_offsets.setdefault(plan.replica_topic, {})[plan.partition] = plan.replica_start
        topic_ids[plan.replica_topic] = plan.replica_topic_id
    copies = set(next_offsets)
    for line in origin or []:
        if line.topic in copies:  # the caller keeps an origin named like its copy out
            raise FailoverRefusedError(
                f"pipeline {spec.name!r}: origin topic {line.topic!r} is also a copy read on "
                f"{target.name!r}; nothing was changed"
            )
        next_offsets.setdefault(line.topic, {})[line.partition] = line.resume
        topic_ids[line.topic] = line.topic_id
    for topic, planned_id in topic_ids.items():
        if _topic_id(replica_admin, topic, spec.name) != planned_id:
            raise FailoverRefusedError(
                f"pipeline {spec.name!r}: replica topic {topic!r} was recreated since the "
                "failover was planned; plan it again; nothing was changed"
            )
    offsets = {topic: TopicOffsets(topic_ids[topic], p) for topic, p in next_offsets.items()}
    carried = read_guard(table, group, spec.name)  # MM2's late copies may follow the switch
    properties = props.commit_properties(
        group_id=group,
        offsets=offsets,
        commit_id=uuid.uuid4().hex,
        cluster_id=target_cluster_id,
        pipeline=spec.name,
        requested_by=requested_by,
        reason=reason,
    )
    properties[FAILOVER_TO] = target.name
    # The uncopied records go to the table property only (ingestion.dr.late_copies.guard), not
    # twice.
    lines = [{k: v for k, v in plan.__dict__.items() if k != "uncopied_records"} for plan in plans]
    properties[FAILOVER_PLAN] = orjson.dumps(lines).decode()
    if spec_topics is not None:
        properties[FAILOVER_TOPICS] = orjson.dumps(spec_topics).decode()
    if assertion is not None:
        properties[FAILOVER_SOURCE_LOST] = orjson.dumps(assertion).decode()
    if origin:
        properties[FAILOVER_ORIGIN] = orjson.dumps([line.__dict__ for line in origin]).decode()
    guard = uncopied_property(group, target.name, source, plans, carried, read)
    commit = ActionCommit(
        spec.name,
        f"failover to {target.name!r}",
        spec.table,
        str(table.metadata.table_uuid),
        {group: planned_from},
        properties,
        table_properties=guard,
        # As `carried` read it: a release committed since is refused, never undone.
        planned_properties={key: table.properties.get(key) for key in guard},
    )
    snapshot_id = commit_action(catalog, commit)
    return ActionOutcome(snapshot_id, properties[props.COMMIT_ID], None)
