"""Operator actions commit like an ingestion: compare-and-set on the state they were planned from.

pyiceberg's own commit retry is off for these commits (``commit_view``, rule 1); this loop owns
it: load the table → check it is the table planned against (uuid), that every guarded group's
offsets (and retirement) are still what the action was planned from → commit on exactly that
head (the ``before_catalog_call`` hook fires just before: tests inject a racing run there). A
commit that lands in between (a run, another action) makes the catalog reject ours (the head
moved); the loop then reloads and re-checks: it aborts naming the commit that moved the offsets
(R7), or retries when they did not move (R27). Never is the action applied on top of a head it
did not check.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingestion import exceptions
from ingestion.kafka.ranges import Key
from ingestion.pipeline.commit import load_table_with_retry
from ingestion.pipeline.hooks import NO_HOOKS, FailureHooks
from ingestion.pipeline.mirror import MirrorOutcome, mirror_table_offsets, read_group_offsets
from ingestion.quarantine.dead_letters import copy_pending_dead_letters
from ingestion.quarantine.sync import sync_quarantine
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.left_out import LEFT_OUT_PREFIX, record_left_out
from ingestion.table.offsets import (
    COMMIT_ID,
    MIGRATED_FROM,
    POSITION_PREFIX,
    RETIRED_GROUPS,
    OffsetMap,
    find_committed_state,
    find_landed_commit,
    offset_groups,
    previous_witness,
    record_position,
)
from ingestion.table.rewind import find_retirement
from ingestion.table.transaction import commit_view

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


@dataclass(frozen=True)
class ActionCommit:
    """One operator action's commit and the state it was planned from.

    ``expected`` maps each guarded group id to the offsets the action was planned from (None:
    the group must have none); ``retired`` maps a guarded group to the snapshot that retired it
    when the action was planned (None: not retired), so a migration racing it is caught too.
    ``table_properties`` are set in the same transaction (they outlive snapshot expiry);
    ``planned_properties`` are the values they had when the action was planned (None: absent):
    a retry on a new head never overwrites one changed since (a ``release-late-copies`` cleared
    the failover's record of uncopied records). ``log_starts`` (a reset's: each partition's log
    start it was planned against) let the record of what the group's reads left out drop the
    ranges retention deleted (``ingestion.table.left_out``).
    """

    pipeline: str
    action: str  # "offset reset", "group migration": named in messages
    table: str
    table_uuid: str
    expected: dict[str, OffsetMap | None]
    properties: dict[str, str]
    delete_filter: str | None = None
    retired: dict[str, int | None] = field(default_factory=dict)
    table_properties: dict[str, str] = field(default_factory=dict)  # set in the same commit
    planned_properties: dict[str, str | None] = field(default_factory=dict)
    log_starts: dict[Key, int] = field(default_factory=dict)


@contextmanager
def ignore_no_match_warning() -> Iterator[None]:
    """pyiceberg warns when a delete matches nothing; for a reset that is an expected case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Delete operation did not match any records")
        yield


def _check_planned_state(table: Table, commit: ActionCommit) -> None:
    """Raise :class:`CommitConflictError` naming whatever moved since the action was planned."""
    for group, offsets in commit.expected.items():
        current = find_committed_state(table, group)
        if (current.offsets if current else None) != offsets:
            mover = current.describe() if current else "a rollback past its first commit"
            raise exceptions.CommitConflictError(
                f"pipeline {commit.pipeline!r}: the {commit.action} was aborted: group {group!r} "
                f"offsets moved since it was planned, by the {mover}; nothing was committed. "
                "Plan it again."
            )
    for key, planned_value in commit.planned_properties.items():
        if table.properties.get(key) != planned_value:
            raise exceptions.CommitConflictError(
                f"pipeline {commit.pipeline!r}: the {commit.action} was aborted: table property "
                f"{key!r} changed since it was planned (a release-late-copies, another switch "
                "or reset); nothing was committed. Plan it again."
            )
    for group, planned in commit.retired.items():
        retirement = find_retirement(table, group)
        if (retirement.snapshot_id if retirement else None) != planned:
            moved = retirement.description if retirement else "a later commit of the group"
            raise exceptions.CommitConflictError(
                f"pipeline {commit.pipeline!r}: the {commit.action} was aborted: group {group!r} "
                f"was retired or brought back since it was planned, by the {moved}; nothing was "
                "committed. Plan it again."
            )


def _write(
    table: Table,
    properties: dict[str, str],
    delete_filter: str | None,
    table_properties: dict[str, str] | None = None,
    log_starts: dict[Key, int] | None = None,
) -> int:
    """One transaction on exactly ``table``'s head, no retry: the delete of the rewound rows (when
    any matched) or an empty append, either carrying ``properties`` (and setting the
    ``table_properties``). Each group it commits keeps its position and its record of what its
    reads left out on purpose (a forward reset's skipped ranges: ``ingestion.table.left_out``),
    both computed from this head and set in the same commit; a retired group loses both."""
    with commit_view(table).transaction() as transaction, ignore_no_match_warning():
        if table_properties:
            transaction.set_properties(table_properties)
        base = transaction.table_metadata.current_snapshot_id
        if delete_filter is not None:
            transaction.delete(delete_filter, snapshot_properties=properties)
        if transaction.table_metadata.current_snapshot_id == base:  # nothing deleted
            with transaction.update_snapshot(snapshot_properties=properties).fast_append():
                pass
        snapshot_id = transaction.table_metadata.current_snapshot_id
        for group in offset_groups(properties):  # each keeps its position (R56)
            source = properties.get(MIGRATED_FROM, group)  # a migration's rows are the old's
            kept = delete_filter is None  # a delete (a rewind) leaves nothing proven
            witness = previous_witness(table.metadata.properties, source) if kept else None
            record_position(transaction, group, witness)
            record_left_out(transaction, table, group, log_starts)
        retired = {g for g in properties.get(RETIRED_GROUPS, "").split(",") if g}
        retired |= {properties[MIGRATED_FROM]} if MIGRATED_FROM in properties else set()
        gone = [
            prefix + g
            for g in sorted(retired)
            for prefix in (POSITION_PREFIX, LEFT_OUT_PREFIX)
            if prefix + g in table.properties
        ]
        if gone:  # a retired group's position must not outlive its retirement's snapshot
            transaction.remove_properties(*gone)
    assert snapshot_id is not None
    return snapshot_id


def commit_action(
    catalog: Catalog,
    commit: ActionCommit,
    hooks: FailureHooks = NO_HOOKS,
    max_attempts: int = 5,
    backoff_s: Callable[[int], float] = lambda attempt: min(2.0, 0.1 * 2**attempt),
) -> int:
    """Commit an operator action exactly once; return its snapshot id.

    Delivery: compare-and-set. If a guarded group's offsets (or retirement) moved since the
    action was planned, nothing is written and :class:`CommitConflictError` names the commit
    that moved them. If the head moved without touching them, the action is re-checked and
    retried on the new head. After an ambiguous catalog error the table is searched for the
    action's commit id: found means committed; absent raises :class:`CommitOutcomeUnknownError`
    (plan the action again: it was not applied). What the commit derives from the head (the
    group's position, its record of skipped ranges) is computed again on each attempt's head,
    inside the same transaction: a retry never records a skip twice, nor drops one recorded
    since the plan.
    """
    from pyiceberg.exceptions import CommitFailedException, NoSuchTableError

    commit_id, groups = commit.properties[COMMIT_ID], offset_groups(commit.properties)
    for attempt in range(1, max_attempts + 1):
        try:
            table = load_table_with_retry(catalog, commit.table)
        except NoSuchTableError as exc:
            raise exceptions.TableDroppedError(
                f"pipeline {commit.pipeline!r}: table {commit.table} was dropped; the "
                f"{commit.action} was not committed"
            ) from exc
        if str(table.metadata.table_uuid) != commit.table_uuid:
            raise exceptions.TableDroppedError(
                f"pipeline {commit.pipeline!r}: table {commit.table} was recreated since the "
                f"{commit.action} was planned; nothing was committed"
            )
        existing = find_landed_commit(table, commit_id, groups)
        if existing is not None:
            return existing
        _check_planned_state(table, commit)
        hooks.fire("before_catalog_call", action=commit.action, table=table)
        try:
            return _write(
                table,
                commit.properties,
                commit.delete_filter,
                commit.table_properties,
                commit.log_starts,
            )
        except CommitFailedException:
            time.sleep(backoff_s(attempt))  # the head moved: reload and re-check
            continue
        except Exception as exc:  # ambiguous: the catalog may or may not have applied it (R3)
            reloaded = load_table_with_retry(catalog, commit.table)
            found = find_landed_commit(reloaded, commit_id, groups)
            if found is not None:
                return found
            raise exceptions.CommitOutcomeUnknownError(
                f"pipeline {commit.pipeline!r}: the catalog call failed ({exc!r}) and the "
                f"{commit.action} (commit {commit_id}) is not in the table; plan it again"
            ) from exc
    raise exceptions.CommitConflictError(
        f"pipeline {commit.pipeline!r}: table {commit.table} kept changing; the {commit.action} "
        f"gave up after {max_attempts} attempts with nothing committed"
    )


def read_group_before(admin: AdminClient | None, group_id: str) -> dict[Key, int] | None:
    """The Kafka group's offsets an action is about to replace (None when they cannot be read)."""
    from confluent_kafka import KafkaException

    if admin is None:
        return None
    try:
        return read_group_offsets(admin, group_id)
    except KafkaException:
        return None


def copy_dead_letters_before(
    catalog: Catalog,
    spec: PipelineSpec,
    admin: AdminClient | None,
    kafka_config: dict[str, Any] | None,
    action: str,
) -> int:
    """Before an action that moves the Kafka group (``admin`` given): copy the dead letters of
    the commits the group has not passed yet; return how many records were copied.

    The search for uncopied commits stops at the first commit the group has passed, so an
    action that moved the group over a commit whose copy had failed lost its letters for good
    (R33). Without ``admin`` the action leaves the group alone, and the next run
    copies first.

    Raises:
        OperationRefusedError: the copy failed; nothing was changed.
    """
    topic = spec.dead_letter_topic
    if admin is None or topic is None or not catalog.table_exists(spec.quarantine_table):
        return 0
    refused = (
        f"pipeline {spec.name!r}: {action} moves Kafka group {spec.consumer_group_id!r} past "
        f"commits whose dead letters are not copied to {topic!r} yet"
    )
    if kafka_config is None:
        raise exceptions.OperationRefusedError(
            f"{refused}, and no Kafka client configuration was given to copy them; nothing was "
            "changed"
        )
    try:
        table = catalog.load_table(spec.table)  # before the sync: it reflects all this read saw
        sync_quarantine(catalog, spec)
        return copy_pending_dead_letters(catalog, spec, table, admin, kafka_config).copies
    except Exception as exc:
        raise exceptions.OperationRefusedError(
            f"{refused}, and copying them failed ({exc}). The offsets were not changed: fix "
            "what the error names (the topic, its ACLs or the broker) and retry; every run "
            "retries the copy too. To act without the copy, remove dead_letter_topic from the "
            "pipeline first (its letters stay in the quarantine table)."
        ) from exc


def mirror_after(
    admin: AdminClient | None, catalog: Catalog, spec: PipelineSpec, group_id: str
) -> MirrorOutcome | None:
    """Best effort after the commit: move the group to the table's offsets (back too, R48)."""
    if admin is None:
        return None
    try:
        return mirror_table_offsets(admin, catalog.load_table(spec.table), group_id)
    except Exception as exc:  # best effort: the next run moves the group
        return MirrorOutcome(group_id, error=f"reading {spec.table} failed ({exc})")


@dataclass(frozen=True)
class ActionOutcome:
    """What an operator action committed, and where the Kafka group is now (``mirror`` is None
    when no Kafka client was given: the next run moves the group)."""

    snapshot_id: int
    commit_id: str
    mirror: MirrorOutcome | None
    notes: list[str] = field(default_factory=list)  # lines for the operator


def refuse_active_runs(spec: PipelineSpec, active_runs: int, action: str) -> None:
    """Refuse an action while ``active_runs`` runs of the pipeline are in progress."""
    if active_runs:
        raise exceptions.CommitConflictError(
            f"pipeline {spec.name!r}: {active_runs} run(s) in progress; wait for them or stop "
            f"them before {action}"
        )
