"""Fail a pipeline over to a MirrorMaker 2 replica, or back: shared by the CLI and the job.

The pipeline reads from its active route (:mod:`platform_assets.route`); the target is a replica
named in its spec (the MM2 flow primary -> replica) or ``primary`` from the replica it reads now
(the reverse flow, the replica's ``failback_*`` settings). The plan translates the table's
committed offsets through the target's newest checkpoints (and the offset syncs when the source
still answers) and aligns them with the table's tail (``ingestion.dr.failover``); the switch is one
compare-and-set commit recorded as an operator action, who and why
(``ingestion.dr.switch``). Delivery: nothing is written by a dry run; the switch refuses
while an ingestion run is active (the Dagster job first waits for one to end:
``platform_assets.operations.actions.hold_ingestion``), and a run that slipped in aborts at its own
commit; retrying a refused or failed switch is safe (nothing was changed, plan again).
:func:`complete_failback` ends the route of a failback once its reverse copies are drained
(``ingestion.dr.failback.complete``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion.dr.failback.complete import apply_completion, plan_completion
from ingestion.dr.failback.copies import recheck_copies
from ingestion.dr.failback.lost import LostReplica, describe_lost, lost_summary
from ingestion.dr.failback.origin import OriginPlan, UndoneSwitch, find_switch
from ingestion.dr.failback.replica import check_replica_copied
from ingestion.dr.failover import plan_failover
from ingestion.dr.late_copies.origin import origin_entries
from ingestion.dr.mm2 import checkpoints_topic, replica_topic
from ingestion.dr.replica_check import read_checkpoints
from ingestion.dr.replica_reader import Replica, cluster_answers, read_offset_syncs
from ingestion.dr.scanned_rows import Floors, Scans
from ingestion.dr.switch import apply_failover
from ingestion.exceptions import (
    CommitConflictError,
    FailoverRefusedError,
    OperationRefusedError,
    ReplicaBehindError,
)
from ingestion.kafka.topics import TopicEnds, read_topic_ends
from ingestion.ops.action import copy_dead_letters_before, mirror_after
from ingestion.pipeline.mirror import mirror_table_offsets
from ingestion.quarantine.dead_letters import is_fenced
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import find_committed_state, flatten
from platform_assets.dr.failback import (
    REPLICA_TIMEOUT_S,
    describe_origin,
    failback_labels,
    origin_links,
    plan_failback_origin,
    refuse_unreachable_replica,
)
from platform_assets.dr.target import (
    SYNCS_TIMEOUT_S,
    describe_local_topics,
    describe_plan,
    failover_target,
)
from platform_assets.route import PRIMARY, Route, active_route
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


def scan_since(switch: UndoneSwitch | None) -> dict[str, Floors]:
    """For a failback, per replica topic the failover's start of each partition: the plan
    reads the table's rows from there once (``ingestion.dr.scanned_rows``), not once per
    partition and stage."""
    starts: dict[str, Floors] = {}
    for entry in switch.plans if switch else []:
        floors = starts.setdefault(str(entry["replica_topic"]), {})
        floors[int(entry["partition"])] = int(entry["replica_start"])
    return starts


def failover_pipeline(
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    to: str,
    *,
    dry_run: bool,
    requested_by: str,
    reason: str,
    active_runs: int = 0,
    source_lost: bool = False,
) -> list[str]:
    """Plan the switch of ``spec`` to cluster ``to`` and (unless ``dry_run``) commit it; return the
    lines describing it. ``source_lost``: the operator asserts the cluster the pipeline reads is
    lost and MM2 copies nothing more from it (``--source-lost``): a table ahead of MM2's copy is
    then accepted (docs/disaster-recovery.md, "A table ahead of MM2"); with ``to`` primary, the
    replica a failback leaves is not read at all, and its records MM2's reverse flow did not copy
    back are lost by that assertion (``ingestion.dr.failback.lost``, R55).

    Raises:
        FailoverRefusedError: the evidence does not single out a position (nothing changed).
        CommitConflictError: a run is active, or the offsets moved since the plan.
    """
    route = active_route(spec, kafka, iceberg)
    if source_lost and to == PRIMARY and route.cluster == PRIMARY:
        raise FailoverRefusedError(
            f"pipeline {spec.name!r}: --source-lost with --to primary asserts that the replica "
            "the pipeline reads is lost, but it reads the primary (no failover is in force): "
            "there is nothing to fail back; nothing was changed. Drop --source-lost"
        )
    goal = failover_target(route, spec, kafka, to)
    catalog = iceberg.load_catalog()
    table = catalog.load_table(spec.table)
    committed = find_committed_state(table, spec.consumer_group_id)
    if committed is None:
        raise FailoverRefusedError(
            f"pipeline {spec.name!r} has committed nothing yet: there is nothing to fail over; "
            f"point the pipeline at {to!r} in the configuration instead"
        )
    target = goal.target
    names = {
        topic: replica_topic(topic, target.source_alias, target.replication_policy)
        for topic in route.spec.source_topics
    }
    # The disaster case, asserted by the operator (a probe cannot tell a lost source from a
    # partition that heals and lets MM2 copy on): a table ahead of the replica is accepted (its
    # last records have no copy; ingestion.dr.align), and the offset syncs, kept on the
    # source, are not read. The probe only informs the refusal without the assertion. A
    # failback with it leaves a lost replica: the same, through MM2's reverse flow, and the
    # origin topics are aligned without reading the replica (ingestion.dr.failback.lost).
    down = source_lost
    # One probe of the replica a failback leaves, as long as a read of it may take: it decides
    # whether --source-lost is refused, whether its offset syncs are read and whether the plan
    # can read it at all (each read of a replica that does not answer waits out its timeout).
    answers = to != PRIMARY or cluster_answers(route.kafka.client_config(), REPLICA_TIMEOUT_S)
    if down and to == PRIMARY and answers:
        # Not read, a replica that answers may hold MM2 copies the plan cannot see, which its
        # reverse flow then delivers: read twice. Only a replica that does not answer is lost.
        raise FailoverRefusedError(
            f"pipeline {spec.name!r}: --source-lost (job config source_lost) says replica "
            f"{route.cluster!r} is lost, but it answers: a failback that does not read it could "
            "read records twice (copies MM2 made there that the plan cannot see). Fail back "
            "without --source-lost; if the replica is lost for good, make sure it no longer "
            "answers (stop or fence its brokers), then retry. Nothing was changed"
        )
    syncs = (
        read_offset_syncs(route.kafka.client_config(), goal.syncs_topic, SYNCS_TIMEOUT_S)
        if goal.syncs_topic and not down and answers
        else {}
    )
    checkpoints = read_checkpoints(target.kafka_config, checkpoints_topic(target.source_alias))
    offsets = flatten(committed.offsets)
    # A failback undoes the newest switch to the replica it leaves: its plan ties the replica's
    # partitions to the origin topics (ingestion.dr.failback.link, ingestion.dr.failback.origin).
    switch = find_switch(table, spec.consumer_group_id, route.cluster) if to == PRIMARY else None
    if switch is not None and not down and not answers:
        refuse_unreachable_replica(spec, route, names)
    # Under MM2's identity naming the replica topic has its origin's name: the rows read on
    # each cluster are told apart by _kafka_cluster, when they record it (docs/cluster-column.md).
    labelled, ambiguous = failback_labels(route.spec, catalog, route, switch)
    links = origin_links(switch, offsets, names, spec.name, labelled, down) if switch else None
    on_cluster = labelled if to == PRIMARY else (PRIMARY if route.cluster == PRIMARY else None)
    scans: Scans = {}  # the table's rows since the failover, read once for both stages
    try:
        plans = plan_failover(
            catalog,
            route.spec,
            offsets,
            target,
            checkpoints,
            syncs,
            names,
            links,
            source_down=down,
            cluster=on_cluster,
            scan_from=scan_since(switch),
            scans=scans,
        )
    except ReplicaBehindError as exc:
        if down:
            raise
        if to != PRIMARY:  # a failback probed the replica it leaves above
            answers = cluster_answers(route.kafka.client_config(), SYNCS_TIMEOUT_S)
        if to == PRIMARY:
            if answers:
                raise FailoverRefusedError(
                    f"pipeline {spec.name!r}: {exc} The replica {route.cluster!r} answers: wait "
                    "for MM2's reverse flow to copy it back"
                ) from exc
            raise FailoverRefusedError(
                f"pipeline {spec.name!r}: {exc} The replica {route.cluster!r} does not answer "
                "now. If it is lost (MM2 will copy nothing more from it), say so with "
                "--source-lost (job config source_lost): the primary then resumes after the "
                "reverse copies, and the records written on the replica that MM2 did not copy "
                "back are lost by that assertion"
            ) from exc
        raise FailoverRefusedError(
            f"pipeline {spec.name!r}: {exc} The source cluster "
            + ("answers: wait for MM2." if answers else "does not answer now.")
            + " If it is lost (MM2 will copy nothing more before the failback: its forward flow "
            "stays stopped), say so with --source-lost (job config source_lost): the replica "
            "then resumes after MM2's copies, and the records the table ingested without a copy "
            "stay ingested once"
        ) from exc
    header = f"failover of {spec.name!r}: {route.cluster} -> {to}"
    lines = [header, *describe_plan(plans, note=to != PRIMARY)]
    if to != PRIMARY:
        lines += describe_local_topics(spec, names, target)
    origin: list[OriginPlan] = []
    lost = (
        LostReplica.from_plans(route.cluster, Replica(target.kafka_config), plans)
        if down and to == PRIMARY
        else None
    )  # the replica a failback leaves is lost: not read (ingestion.dr.failback.lost)
    if to == PRIMARY:  # the unreplicated tail of the origin topics (R49)
        origin = plan_failback_origin(
            spec,
            catalog,
            route,
            goal.kafka,
            names,
            offsets,
            switch,
            labelled,
            ambiguous,
            lost=lost,
            scans=scans,
        )
        lines += describe_origin(origin, route.cluster)
        lines += describe_lost(plans, route.cluster, spec.name) if lost else []
    scans.clear()  # the plan's reads are done: the scanned rows are not held through the commit
    if dry_run:
        return [*lines, "dry run: nothing committed"]
    # Before the recheck, which must stay just before the commit (a copy may take seconds).
    lines += copy_owed_dead_letters(
        catalog,
        route,
        down,
        "the failover",
        refuse=False,
        answers=answers if to == PRIMARY else None,
    )
    if origin and not down:  # MM2's forward flow must not have copied tail records (R49)
        replica = Replica(route.kafka.client_config(), REPLICA_TIMEOUT_S)
        recheck_copies(origin, replica, Replica(goal.kafka.client_config()), spec.name)
    # The origin records a failback from a lost replica reads: MM2 may have copied them there.
    read = origin_entries(lost.reverse, origin, plans, spec.name) if lost else None
    originals = dict(zip(route.spec.source_topics, spec.source_topics, strict=True))
    outcome = apply_failover(
        catalog,
        route.spec,
        plans,
        committed.offsets,
        target,
        goal.kafka.get_cluster_id(),
        goal.kafka.get_admin_client(),
        requested_by,
        reason,
        active_runs,
        spec_topics={originals[t]: copy for t, copy in names.items()},
        origin=origin,
        source=route.cluster,
        assertion=lost_summary(plans, route.cluster) if lost else None,
        read=read,
    )
    table = catalog.load_table(spec.table)
    mirrored = mirror_table_offsets(goal.kafka.get_admin_client(), table, spec.consumer_group_id)
    return [
        *lines,
        f"switched to {to!r} in snapshot {outcome.snapshot_id} by {requested_by!r} "
        f"(reason {reason!r}); the pipeline now reads there",
        mirrored.describe(),
    ]


def copy_owed_dead_letters(
    catalog: Catalog,
    route: Route,
    lost: bool,
    action: str,
    *,
    refuse: bool = True,
    answers: bool | None = None,
) -> list[str]:
    """Before a switch that moves the Kafka group: copy to the dead-letter topic on the route's
    cluster the letters of the commits its group has not passed (a run whose copy failed left
    them owed; after the switch no run searches those commits again); the lines saying so.

    A cluster the operator asserted ``lost``, or one that does not answer (``answers``: the
    caller's probe of it, else one now), is not asked; with
    ``refuse`` False (a failover or failback: a disaster must not wait on a copy) a copy that
    fails is not a refusal either. Either way the owed letters stay in the quarantine table
    only, and a line says so.

    Raises:
        OperationRefusedError: with ``refuse`` (a failback completion), the copy failed on a
            cluster that answers; nothing was changed.
    """
    spec, kafka = route.spec, route.kafka
    topic = spec.dead_letter_topic
    if topic is None:
        return []

    def left(why: str) -> list[str]:
        return [
            f"dead letters owed on {route.cluster!r} (of commits its group had not passed) are "
            f"not copied to {topic!r} there ({why}): they stay in {spec.quarantine_table}"
        ]

    if answers is None and not lost:
        answers = cluster_answers(kafka.client_config(), SYNCS_TIMEOUT_S)
    if lost or not answers:
        return left("lost" if lost else "it does not answer")
    try:
        copied = copy_dead_letters_before(
            catalog, spec, kafka.get_admin_client(), kafka.client_config(), action
        )
    except OperationRefusedError as exc:
        if refuse:
            raise
        return left(f"the copy failed: {exc.__cause__ or exc}")
    if not copied:
        return []
    return [f"copied {copied} owed dead letter(s) to {topic!r} on {route.cluster!r} first"]


def complete_failback(
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    *,
    dry_run: bool,
    requested_by: str,
    reason: str,
    active_runs: int = 0,
) -> list[str]:
    """End the route of ``spec``'s failback once every reverse copy is read to its end on the
    primary (``ingestion.dr.failback.complete``), unless ``dry_run``; return the lines describing
    it.

    Raises:
        FailoverRefusedError: no failback in force, or a reverse copy not drained (nothing
            changed).
        CommitConflictError: a run is active, or other commits kept moving the offsets.
    """
    catalog = iceberg.load_catalog()
    primary = kafka.client_config()

    def read_ends(topics: list[str]) -> dict[str, TopicEnds | None]:
        return read_topic_ends(primary, topics, open_transactions=True)

    # First, so the checks below stay just before the commit (a copy may take seconds); the
    # commit's attempts copy again after each plan (apply_completion).
    owed = (
        []
        if dry_run
        else copy_owed_dead_letters(
            catalog, active_route(spec, kafka, iceberg), False, "the failback completion"
        )
    )
    cluster_id = kafka.get_cluster_id()
    table = catalog.load_table(spec.table)
    plan = plan_completion(table, spec, cluster_id, read_ends)
    # The primary's end proves only what MM2 copied so far: the replica must hold nothing more.
    replicas = {
        replica.name: Replica(kafka.for_cluster(replica.name).client_config(), REPLICA_TIMEOUT_S)
        for replica in spec.replicas
    }
    group = spec.consumer_group_id
    notes = check_replica_copied(table, group, plan.dropped, replicas, Replica(primary), spec.name)
    if dry_run:
        return [*plan.describe(spec.name), *notes, "dry run: nothing committed"]
    route = active_route(spec, kafka, iceberg)

    def copy_again() -> None:  # a run that won a race may have left its copy failed
        try:
            owed.extend(copy_owed_dead_letters(catalog, route, False, "the failback completion"))
        except OperationRefusedError as exc:
            if is_fenced(exc.__cause__):  # a run's copier at the same time: plan again
                raise CommitConflictError(str(exc)) from exc
            raise

    plan, snapshot_id = apply_completion(
        catalog, spec, cluster_id, read_ends, requested_by, reason, active_runs, copy_again
    )
    mirrored = mirror_after(kafka.get_admin_client(), catalog, spec, spec.consumer_group_id)
    return [
        *plan.describe(spec.name),
        *owed,
        *notes,
        f"completed in snapshot {snapshot_id} by {requested_by!r} (reason {reason!r}): the "
        f"pipeline reads {spec.source_topics} on the primary, as before the failover",
        *([mirrored.describe()] if mirrored else []),
    ]
