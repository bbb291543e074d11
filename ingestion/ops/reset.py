"""Operator actions on a pipeline's offsets: reset to a position, migrate to a new group id.

Both are explicit commits in the table (a snapshot whose properties carry the new offsets and who
asked and why), compare-and-set against the offsets they were planned from
(:mod:`ingestion.ops.action`): a run that commits first makes the action abort naming it, and a run
in flight when the action commits aborts at its own commit naming the action (R7). A reset that
moves a partition backwards also deletes, in the same snapshot, the rows at or after its new
offset, so the range is re-read exactly once; the quarantine table follows after that commit
(ingestion.quarantine.sync). A reset that moves a partition forwards skips exactly
``[old committed offset, new offset)``, and records it, with who, why and when, in the table
property ``kafka.left-out.<group>`` in the same commit, where the audits read it after the
reset's snapshot expired (``ingestion.table.left_out``); a later backward reset cuts out of it
what it reads again. Both then move the Kafka group to the table's offsets, backwards too
(best effort: if that fails, the next run does it, R48).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingestion import exceptions
from ingestion.kafka.ranges import Key
from ingestion.kafka.topics import describe_topic, list_pipeline_topics
from ingestion.ops.action import (
    ActionCommit,
    ActionOutcome,
    commit_action,
    copy_dead_letters_before,
    mirror_after,
    read_group_before,
    refuse_active_runs,
)
from ingestion.pipeline.hooks import NO_HOOKS, FailureHooks
from ingestion.pipeline.mirror import MirrorOutcome, read_group_offsets
from ingestion.pipeline.plan import resolve_starting_offsets
from ingestion.quarantine.dead_letters import (
    DELIVERED,
    dead_letter_topic_identity,
    mark_delivered,
)
from ingestion.quarantine.sync import sync_quarantine
from ingestion.spec.pipeline import PipelineSpec, StartingPosition
from ingestion.table import offsets as props
from ingestion.table.offsets import OffsetMap, TopicOffsets, find_committed_state, flatten
from ingestion.table.rewind import find_retirement
from ingestion.table.route import route_cluster
from ingestion.table.schema import PRIMARY, cluster_condition

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


@dataclass(frozen=True)
class OffsetReset:
    """A planned reset: the offsets it starts from and those it will commit."""

    pipeline: str
    group_id: str
    table_uuid: str
    committed: OffsetMap | None
    target: OffsetMap
    changes: dict[Key, tuple[int | None, int]] = field(default_factory=dict)
    retired_snapshot: int | None = None  # the migration that had retired the group, if any
    log_starts: dict[Key, int] = field(default_factory=dict)  # when planned: retention's bound

    def describe(self) -> list[str]:
        """One line per partition: what would be re-read or skipped (the dry run)."""
        lines = []
        for (topic, partition), (before, after) in sorted(self.changes.items()):
            if before is None:
                effect = "no committed offset yet"
            elif after < before:
                effect = f"re-read {before - after} offsets"
            elif after > before:
                effect = f"skip {after - before} offsets"
            else:
                effect = "unchanged"
            lines.append(f"{topic}[{partition}]: {before} -> {after} ({effect})")
        return lines


@dataclass(frozen=True)
class ResetRequest:
    """Where a reset moves the offsets, in kafka-consumer-groups' words: ``position``
    (``--to-earliest``, ``--to-latest``, ``--to-datetime``), else ``to_offset``
    (``--to-offset``) or ``shift_by`` (``--shift-by``, from the committed offset); for every
    partition, or for ``partitions`` only (``--topic t:p``: the others keep their offsets).
    An offset outside a partition's log is clamped to its log start or end, as
    kafka-consumer-groups does."""

    position: StartingPosition = field(default_factory=StartingPosition)
    to_offset: int | None = None
    shift_by: int | None = None
    partitions: frozenset[Key] | None = None


def rollback_request(table: Table, group_id: str, snapshot_id: int) -> ResetRequest:
    """A reset back to where ``snapshot_id``, one of the group's commits in the table's
    history, left the offsets: ``platform rollback --to-snapshot``. Unlike an Iceberg rollback
    (moving the table's head, which no snapshot records and which leaves the offsets' table
    property ahead, R56) it is a recorded commit: the rows read after that commit are deleted
    and re-read once, and who and why are kept; maintenance since (compaction) stays.

    Raises:
        OperationRefusedError: the snapshot is not in the head's history, or commits no offsets
            of the group.
    """
    history = {s.snapshot_id: s for s in props.iter_ancestry(table)}
    snapshot = history.get(snapshot_id)
    text = (
        props.snapshot_properties(snapshot).get(props.OFFSETS_PREFIX + group_id)
        if snapshot
        else None
    )
    if text is None:
        where = "is not in the table's history" if snapshot is None else "commits no offsets"
        raise exceptions.OperationRefusedError(
            f"snapshot {snapshot_id} {where} of group {group_id!r}: roll back to one of its "
            "commits (platform status lists the newest; Iceberg's snapshots table all)"
        )
    offsets = {f"{t}:{p}": o for (t, p), o in flatten(props.decode_offsets(text)).items()}
    return ResetRequest(StartingPosition(mode="offsets", offsets=offsets))


def _requested_offsets(
    spec: PipelineSpec,
    request: ResetRequest,
    consumer: Consumer,
    topics: list[Any],
    before: dict[Key, int],
) -> dict[Key, int]:
    """The offsets ``request`` asks for, per partition of ``topics``."""
    bounds = {
        (state.topic, part.partition): (part.log_start_offset, part.end_offset)
        for state in topics
        for part in state.partitions
    }
    chosen = set(bounds) if request.partitions is None else set(request.partitions)
    unknown = sorted(chosen - set(bounds))
    if unknown:
        raise exceptions.OperationRefusedError(
            f"pipeline {spec.name!r}: no partition {unknown} among its topics' "
            f"{sorted(bounds)}; nothing was changed"
        )
    if request.to_offset is None and request.shift_by is None:
        at = spec.model_copy(update={"starting_position": request.position})
        wanted = resolve_starting_offsets(at, consumer, topics)
    else:
        uncommitted = sorted(k for k in chosen if k not in before)
        if request.shift_by is not None and uncommitted:
            raise exceptions.OperationRefusedError(
                f"pipeline {spec.name!r}: --shift-by moves committed offsets, and {uncommitted} "
                "has none yet; use --to-offset or --to-earliest for it"
            )
        shift = request.shift_by or 0
        wanted = {
            key: before[key] + shift if request.to_offset is None else request.to_offset
            for key in chosen
        }
    target = {key: min(max(wanted[key], bounds[key][0]), bounds[key][1]) for key in chosen}
    if chosen != set(bounds):  # the others keep theirs (or start as the spec says)
        own = resolve_starting_offsets(spec, consumer, topics)
        target |= {key: before.get(key, own[key]) for key in set(bounds) - chosen}
    return target


def plan_reset(
    spec: PipelineSpec,
    table: Table,
    admin: AdminClient,
    consumer: Consumer,
    position: StartingPosition | ResetRequest,
) -> OffsetReset:
    """Resolve ``position`` (a :class:`ResetRequest`, or a position for every partition)
    against Kafka and compare it with the committed offsets (no write).

    Raises:
        OperationRefusedError: a requested partition is not the pipeline's, or ``shift_by``
            asks to shift a partition with no committed offset.
    """
    request = position if isinstance(position, ResetRequest) else ResetRequest(position)
    topics = [describe_topic(admin, consumer, name) for name in list_pipeline_topics(admin, spec)]
    committed = find_committed_state(table, spec.consumer_group_id)
    before = flatten(committed.offsets) if committed else {}
    target = _requested_offsets(spec, request, consumer, topics, before)
    by_topic: dict[str, dict[int, int]] = {}
    for (topic, partition), offset in target.items():
        by_topic.setdefault(topic, {})[partition] = offset
    ids = {state.topic: state.topic_id for state in topics}
    changes = {key: (before.get(key), offset) for key, offset in target.items()}
    refuse_ambiguous_rewind(spec.name, changes, clusters_read(table, spec.consumer_group_id))
    retirement = find_retirement(table, spec.consumer_group_id)
    return OffsetReset(
        spec.name,
        spec.consumer_group_id,
        str(table.metadata.table_uuid),
        committed.offsets if committed else None,
        {topic: TopicOffsets(ids[topic], parts) for topic, parts in by_topic.items()},
        changes,
        retirement.snapshot_id if retirement else None,
        {
            (state.topic, part.partition): part.log_start_offset
            for state in topics
            for part in state.partitions
        },
    )


def clusters_read(table: Table, group_id: str) -> dict[str, set[str]]:
    """The cluster ids of the group's commits in the table's lineage, per topic name."""
    seen: dict[str, set[str]] = {}
    for snapshot in props.iter_ancestry(table):
        properties = props.snapshot_properties(snapshot)
        text = properties.get(props.OFFSETS_PREFIX + group_id)
        cluster = properties.get(props.CLUSTER_ID)
        for topic in props.decode_offsets(text) if text and cluster else {}:
            seen.setdefault(topic, set()).add(cluster or "")
    return seen


def refuse_ambiguous_rewind(
    pipeline: str, changes: dict[Key, tuple[int | None, int]], read_on: dict[str, set[str]]
) -> None:
    """Refuse a backward reset of a topic name the table read on two clusters (pure).

    After a failback under MM2's identity naming, ``primary.orders`` was read on the replica
    and then on the primary: two topics, one name, unrelated offsets. The table's rows carry
    topic, partition and offset but not the cluster, so deleting "rows at or after offset X"
    would also delete rows read on the other cluster: records lost, or read twice.

    Example:
        >>> refuse_ambiguous_rewind("p", {("t", 0): (9, 5)}, {"t": {"a"}})
        >>> refuse_ambiguous_rewind("p", {("t", 0): (9, 5)}, {"t": {"a", "b"}})
        Traceback (most recent call last):
        ...
        ingestion.exceptions.AmbiguousRewindError: pipeline 'p': a backward reset of t[0] ...
    """
    for (topic, partition), (before, after) in sorted(changes.items()):
        if before is None or after >= before or len(read_on.get(topic, set())) < 2:
            continue
        raise exceptions.AmbiguousRewindError(
            f"pipeline {pipeline!r}: a backward reset of {topic}[{partition}] ({before} -> "
            f"{after}) is refused: the table read topic {topic!r} on {len(read_on[topic])} "
            "clusters (a failback with MirrorMaker 2's identity replication policy), and its "
            "rows do not record the cluster, so the rewind would delete rows read on the other "
            "cluster. Reset forward only, or replicate with replication_policy: identity and "
            "failback_replication_policy: default (distinct names); nothing was changed"
        )


def _rewound_filter(table: Table, changes: dict[Key, tuple[int | None, int]]) -> str | None:
    """The rows a backward reset deletes: at or after each rewound offset, read on the
    primary (a reset runs on the pipeline's own cluster only: it is refused on a moved route).
    Rows recording another cluster (``_kafka_cluster``) at the same coordinates, read there under
    MM2's identity naming, are other records and stay."""
    clauses = [
        f"(_kafka_topic = '{topic}' and _kafka_partition = {partition} "
        f"and _kafka_offset >= {after})"
        for (topic, partition), (before, after) in sorted(changes.items())
        if before is not None and after < before
    ]
    if not clauses:
        return None
    return f"({' or '.join(clauses)}){cluster_condition(table, PRIMARY) or ''}"


def apply_reset(
    catalog: Catalog,
    spec: PipelineSpec,
    reset: OffsetReset,
    cluster_id: str,
    requested_by: str,
    reason: str,
    active_runs: int = 0,
    hooks: FailureHooks = NO_HOOKS,
    admin: AdminClient | None = None,
    kafka_config: dict[str, Any] | None = None,
) -> ActionOutcome:
    """Commit ``reset``, then (with ``admin``) move the Kafka group to the table's offsets.
    With a dead-letter topic, the letters the group has not passed yet are copied first
    (``kafka_config``), and a copy that fails refuses the reset
    (:func:`ingestion.ops.action.copy_dead_letters_before`).

    Delivery: compare-and-set (:func:`ingestion.ops.action.commit_action`). If the offsets moved
    since the reset was planned, nothing is written and :class:`CommitConflictError` names the
    commit that moved them; a run in flight when it commits aborts at its own commit. The Kafka
    group's offsets it replaces are recorded in the snapshot, so if moving the group fails the
    next run moves it back (R48). An ambiguous catalog error is reconciled by the reset's commit
    id; calling it again with the same plan after it committed aborts (the offsets moved, by
    this very reset), so it is never applied twice. The ranges a forward reset skips,
    ``[committed offset, new offset)`` per partition, go into the table property
    ``kafka.left-out.<group>`` in the same commit, computed inside it from the head each
    attempt commits on (``ingestion.table.left_out``): a retry on a new head recomputes them
    from that head, a replay found by its commit id writes nothing again, and an outcome found
    absent wrote nothing; so a skip is recorded once, with its reset, or not at all. The
    quarantine table is synced after the data commit (a :class:`QuarantineSyncError` then means
    the reset stands; the next run syncs it and moves the group). With the dead-letter copy
    done, the reset also lists the records it re-reads whose letters the topic holds
    (``kafka.dead-letters.delivered``, set in the same commit), so they are not copied a second
    time. ``hooks`` fire before the data table's catalog call (``before_catalog_call``) and
    after its commit (``after_commit``), for tests (rule 6).

    Raises:
        CommitConflictError: a run is in progress (``active_runs``) or the offsets moved.
    """
    refuse_active_runs(spec, active_runs, "resetting offsets")
    table = catalog.load_table(spec.table)
    if (reads := route_cluster(table, reset.group_id)) != PRIMARY:  # its delete is the primary's
        raise exceptions.OperationRefusedError(
            f"pipeline {spec.name!r} reads cluster {reads!r} since a failover: a reset is refused "
            "on a moved route; fail back and complete the failback first "
            "(docs/disaster-recovery.md, 'Completing a failback'); nothing was changed"
        )
    current = find_committed_state(table, reset.group_id)
    if (
        str(table.metadata.table_uuid) != reset.table_uuid
        or (current.offsets if current else None) != reset.committed
    ):
        mover = current.describe() if current else "a commit that removed them"
        raise exceptions.CommitConflictError(
            f"pipeline {spec.name!r}: offsets or table changed since the reset was planned (by "
            f"the {mover}); plan it again"
        )
    copy_dead_letters_before(catalog, spec, admin, kafka_config, "the reset")
    delete_filter = _rewound_filter(table, reset.changes)
    marks, notes = delivered_letters(
        catalog, spec, table, reset, current, cluster_id, admin, kafka_config
    )
    properties = props.commit_properties(
        group_id=reset.group_id,
        offsets=reset.target,
        commit_id=uuid.uuid4().hex,
        cluster_id=cluster_id,
        pipeline=spec.name,
        requested_by=requested_by,
        reason=reason,
        group_offsets_before=read_group_before(admin, reset.group_id),
    )
    commit = ActionCommit(
        spec.name,
        "offset reset",
        spec.table,
        reset.table_uuid,
        {reset.group_id: reset.committed},
        properties,
        delete_filter,
        {reset.group_id: reset.retired_snapshot},
        table_properties=marks,
        planned_properties={DELIVERED: table.properties.get(DELIVERED)} if marks else {},
        log_starts=reset.log_starts,
    )
    snapshot_id = commit_action(catalog, commit, hooks)
    hooks.fire("after_commit", reset=reset, snapshot_id=snapshot_id)
    # Dead letters of a rewound range go only after the data commit, by the quarantine sync; if
    # this fails the next run syncs (never before: a failed data commit would lose them).
    sync_quarantine(catalog, spec)
    mirror = mirror_after(admin, catalog, spec, reset.group_id)
    return ActionOutcome(snapshot_id, properties[props.COMMIT_ID], mirror, notes)


def delivered_letters(
    catalog: Catalog,
    spec: PipelineSpec,
    table: Table,
    reset: OffsetReset,
    current: props.CommittedState | None,
    cluster_id: str,
    admin: AdminClient | None,
    kafka_config: dict[str, Any] | None,
) -> tuple[dict[str, str], list[str]]:
    """The table property listing the dead letters a backward reset re-reads that the topic
    holds already (``ingestion.quarantine.dead_letters.mark_delivered``), and notes. Only after
    the reset's own copy (``admin`` and ``kafka_config`` given, a dead-letter topic) and for the
    topics read on this cluster under the topic id the committed offsets name: a recreated
    topic's records are new."""
    if admin is None or kafka_config is None or spec.dead_letter_topic is None:
        return {}, []
    if current is None or current.cluster_id not in (None, cluster_id):
        return {}, []
    if not catalog.table_exists(spec.quarantine_table):
        return {}, []
    quarantine = catalog.load_table(spec.quarantine_table)
    rewound = _rewound_filter(quarantine, reset.changes)
    if rewound is None:
        return {}, []
    same = {
        topic: offsets.topic_id
        for topic, offsets in current.offsets.items()
        if topic in reset.target and reset.target[topic].topic_id == offsets.topic_id
    }
    before = {key: b for key, (b, _) in reset.changes.items() if b is not None}
    group = read_group_before(admin, reset.group_id) or {}
    topic = dead_letter_topic_identity(admin, spec.dead_letter_topic)
    return mark_delivered(
        table, quarantine, kafka_config, spec, cluster_id, before, same, rewound, group, topic
    )


@dataclass(frozen=True)
class Migration:
    """What a group migration did: the snapshot, the new group's mirror, the old group's state."""

    snapshot_id: int
    offsets: dict[Key, int]
    mirror: MirrorOutcome
    old_group_offsets: dict[Key, int]


def migrate_group(
    catalog: Catalog,
    spec: PipelineSpec,
    new_group_id: str,
    admin: AdminClient,
    requested_by: str,
    reason: str,
    active_runs: int = 0,
    hooks: FailureHooks = NO_HOOKS,
    kafka_config: dict[str, Any] | None = None,
) -> Migration:
    """Carry the pipeline's offsets over to ``new_group_id`` in one commit that retires the old
    group, and move the new Kafka group to them; the old Kafka group is left untouched. With a
    dead-letter topic, the letters the old group has not passed yet are copied first
    (``kafka_config``; a copy that fails refuses the migration, nothing changed).

    Then set ``consumer_group_id: <new>`` in the spec: the next run reads nothing twice. Until
    then runs under the old group are refused (retired, R22).

    Delivery: compare-and-set on the old group's offsets (and on the new group having none): a
    run that commits under the old group first makes the migration abort naming it; a run in
    flight when the migration commits aborts at its own commit naming the migration (R7).

    Raises:
        CommitConflictError: runs in progress, the old group already retired, the new group
            already holding offsets, or the offsets moved meanwhile.
    """
    refuse_active_runs(spec, active_runs, "migrating the group")
    old_group = spec.consumer_group_id
    table = catalog.load_table(spec.table)
    old = find_committed_state(table, old_group)
    if old is None:
        raise exceptions.MissingOffsetsError(
            f"pipeline {spec.name!r}: table {spec.table} has no offsets under {old_group!r}"
        )
    if find_committed_state(table, new_group_id) is not None:
        raise exceptions.CommitConflictError(
            f"pipeline {spec.name!r}: table {spec.table} already has offsets under "
            f"{new_group_id!r}; reset them explicitly instead of migrating"
        )
    retirement = find_retirement(table, old_group)
    if retirement is not None:
        raise exceptions.CommitConflictError(
            f"pipeline {spec.name!r}: group {old_group!r} was already retired by the "
            f"{retirement.description}"
        )
    copy_dead_letters_before(catalog, spec, admin, kafka_config, "the group migration")
    properties = props.commit_properties(
        group_id=new_group_id,
        offsets=old.offsets,
        commit_id=uuid.uuid4().hex,
        cluster_id=old.cluster_id or "",
        pipeline=spec.name,
        requested_by=requested_by,
        reason=reason,
        migrated_from=old_group,
        retired_groups=[old_group],
        group_offsets_before=read_group_before(admin, new_group_id),
    )
    commit = ActionCommit(
        spec.name,
        "group migration",
        spec.table,
        str(table.metadata.table_uuid),
        {old_group: old.offsets, new_group_id: None},
        properties,
        retired={old_group: None},
    )
    snapshot_id = commit_action(catalog, commit, hooks)
    mirror = mirror_after(admin, catalog, spec, new_group_id)
    assert mirror is not None
    return Migration(
        snapshot_id, flatten(old.offsets), mirror, read_group_offsets(admin, old_group)
    )
