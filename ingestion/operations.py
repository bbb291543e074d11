"""Operator actions on a pipeline's offsets: reset to a position, migrate to a new group id.

Both are explicit commits in the table (a snapshot whose properties carry the new offsets and who
asked and why), compare-and-set against the offsets they were planned from, so a run in flight
aborts at its own commit instead of racing them. A reset that moves a partition backwards also
deletes, in the same snapshot, the rows at or after its new offset (and their quarantine rows),
so the range is re-read exactly once.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ingestion import exceptions
from ingestion import offsets as props
from ingestion.commit import append_files, commit_view
from ingestion.hooks import NO_HOOKS, FailureHooks
from ingestion.mirror import MirrorOutcome, mirror_offsets, read_group_offsets
from ingestion.offsets import OffsetMap, TopicOffsets, find_commit, find_committed_state, flatten
from ingestion.plan import resolve_starting_offsets
from ingestion.ranges import Key
from ingestion.spec import PipelineSpec, StartingPosition
from ingestion.topics import describe_topic, list_pipeline_topics

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


def plan_reset(
    spec: PipelineSpec,
    table: Table,
    admin: AdminClient,
    consumer: Consumer,
    position: StartingPosition,
) -> OffsetReset:
    """Resolve ``position`` against Kafka and compare it with the committed offsets (no write)."""
    topics = [describe_topic(admin, consumer, name) for name in list_pipeline_topics(admin, spec)]
    target_spec = spec.model_copy(update={"starting_position": position})
    target = resolve_starting_offsets(target_spec, consumer, topics)
    committed = find_committed_state(table, spec.consumer_group_id)
    before = flatten(committed.offsets) if committed else {}
    by_topic: dict[str, dict[int, int]] = {}
    for (topic, partition), offset in target.items():
        by_topic.setdefault(topic, {})[partition] = offset
    ids = {state.topic: state.topic_id for state in topics}
    return OffsetReset(
        spec.name,
        spec.consumer_group_id,
        str(table.metadata.table_uuid),
        committed.offsets if committed else None,
        {topic: TopicOffsets(ids[topic], parts) for topic, parts in by_topic.items()},
        {key: (before.get(key), offset) for key, offset in target.items()},
    )


def _rewound_filter(changes: dict[Key, tuple[int | None, int]]) -> str | None:
    clauses = [
        f"(_kafka_topic = '{topic}' and _kafka_partition = {partition} "
        f"and _kafka_offset >= {after})"
        for (topic, partition), (before, after) in sorted(changes.items())
        if before is not None and after < before
    ]
    return " or ".join(clauses) or None


@contextmanager
def _no_match_is_fine() -> Iterator[None]:
    """pyiceberg warns when a delete matches nothing; for a reset that is an expected case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Delete operation did not match any records")
        yield


def _commit_offsets(table: Table, properties: dict[str, str], delete_filter: str | None) -> int:
    """One snapshot carrying ``properties``: a delete when rows must go, else an empty append."""
    commit_id = properties[props.COMMIT_ID]
    with commit_view(table).transaction() as transaction, _no_match_is_fine():
        if delete_filter is not None:
            transaction.delete(delete_filter, snapshot_properties=properties)
    table.refresh()
    found = find_commit(table, commit_id)
    if found is None:  # nothing to delete made no snapshot: record the offsets on their own
        return append_files(table, [], properties)
    return found.snapshot_id


def apply_reset(
    catalog: Catalog,
    spec: PipelineSpec,
    reset: OffsetReset,
    cluster_id: str,
    requested_by: str,
    reason: str,
    active_runs: int = 0,
    hooks: FailureHooks = NO_HOOKS,
) -> int:
    """Commit ``reset``; return its snapshot id.

    Delivery: compare-and-set. If the offsets moved since the reset was planned, nothing is
    written and :class:`CommitConflictError` is raised; a run in flight when it commits aborts
    at its own commit.

    Raises:
        CommitConflictError: a run is in progress (``active_runs``) or the offsets moved.
    """
    if active_runs:
        raise exceptions.CommitConflictError(
            f"pipeline {spec.name!r}: {active_runs} run(s) in progress; wait for them or stop "
            "them before resetting offsets"
        )
    table = catalog.load_table(spec.table)
    current = find_committed_state(table, reset.group_id)
    if (
        str(table.metadata.table_uuid) != reset.table_uuid
        or (current.offsets if current else None) != reset.committed
    ):
        raise exceptions.CommitConflictError(
            f"pipeline {spec.name!r}: offsets or table changed since the reset was planned; "
            "plan it again"
        )
    delete_filter = _rewound_filter(reset.changes)
    if delete_filter and catalog.table_exists(spec.quarantine_table):
        quarantine = catalog.load_table(spec.quarantine_table)
        with quarantine.transaction() as transaction, _no_match_is_fine():
            transaction.delete(delete_filter)
    properties = props.commit_properties(
        group_id=reset.group_id,
        offsets=reset.target,
        commit_id=uuid.uuid4().hex,
        cluster_id=cluster_id,
        pipeline=spec.name,
        requested_by=requested_by,
        reason=reason,
    )
    hooks.fire("before_action_commit")
    return _commit_offsets(table, properties, delete_filter)


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
    hooks: FailureHooks = NO_HOOKS,
) -> Migration:
    """Carry the pipeline's offsets over to ``new_group_id`` in one commit and mirror them to
    the new Kafka group; the old Kafka group is left untouched and reported.

    Then set ``consumer_group_id: <new>`` in the spec: the next run reads nothing twice.
    """
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
    properties = props.commit_properties(
        group_id=new_group_id,
        offsets=old.offsets,
        commit_id=uuid.uuid4().hex,
        cluster_id=old.cluster_id or "",
        pipeline=spec.name,
        requested_by=requested_by,
        reason=reason,
        migrated_from=old_group,
    )
    hooks.fire("before_action_commit")
    snapshot_id = _commit_offsets(table, properties, None)
    offsets = flatten(old.offsets)
    mirror = mirror_offsets(admin, new_group_id, offsets)
    return Migration(
        snapshot_id, offsets, mirror, read_group_offsets(admin, spec.consumer_group_id)
    )
