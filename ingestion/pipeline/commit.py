"""Step 3, the commit (driver = coordinator): one snapshot with the files and the offsets.

The commit is a compare-and-set on the group's offsets: valid only while the table's offsets for
the group still equal the plan's start offsets, re-checked after every refresh (rule 1).
pyiceberg's own commit retry re-bases an append onto a new head without that check, so it is
disabled for these commits and this module owns the loop: refresh -> re-check -> retry, or abort.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingestion import exceptions
from ingestion.pipeline.hooks import NO_HOOKS, FailureHooks
from ingestion.pipeline.plan import Plan
from ingestion.table.left_out import record_left_out
from ingestion.table.offsets import (
    GROUP_ID,
    QUARANTINED,
    Witness,
    find_committed_state,
    find_landed_commit,
    flatten,
    previous_witness,
    record_position,
)
from ingestion.table.rewind import find_retirement
from ingestion.table.transaction import commit_view

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

    from ingestion.table.upsert import ApplyChanges


@dataclass(frozen=True)
class CommitOutcome:
    """The snapshot that holds the commit; ``replayed`` when it already existed (R5)."""

    snapshot_id: int
    replayed: bool
    attempts: int


def append_files(
    table: Table, files: list[DataFile], properties: dict[str, str], witness: Witness | None = None
) -> int:
    """Append ``files`` (possibly none) in one snapshot with ``properties``, and set the
    group's position table property (R56, ``witness``: a row of ``files``) and its record of
    what its reads left out on purpose (``ingestion.table.left_out``) in the same commit; no
    retry."""
    group = properties[GROUP_ID]
    if not files and properties.get(QUARANTINED, "0") == "0":  # no row, no dead letter
        witness = previous_witness(table.metadata.properties, group)
    with commit_view(table).transaction() as transaction:
        with transaction.update_snapshot(snapshot_properties=properties).fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)
        record_position(transaction, group, witness)
        record_left_out(transaction, table, group)
    committed = transaction.table_metadata.current_snapshot()
    assert committed is not None
    return committed.snapshot_id


def _check_no_regression(plan: Plan) -> None:
    """Refuse a commit that moves an offset backwards or drops a partition (R11)."""
    before = flatten(plan.committed or {})
    after = flatten(plan.next_offsets())
    dropped = sorted(set(before) - set(after))
    backwards = sorted(k for k in before if k in after and after[k] < before[k])
    if dropped or backwards:
        raise exceptions.OffsetRegressionError(
            f"pipeline {plan.pipeline!r}: refusing to commit; partitions dropped {dropped}, "
            f"offsets moving backwards {[(k, before[k], after[k]) for k in backwards]}"
        )


def delete_files(table: Table, files: list[DataFile]) -> None:
    """Delete the files of an aborted attempt (only ever ours, and only after a clean abort)."""
    for data_file in files:
        table.io.delete(data_file.file_path)


def load_table_with_retry(
    catalog: Catalog, identifier: str, attempts: int = 5, wait_s: float = 0.5
) -> Table:
    """Load a table, retrying a slow or unavailable catalog with backoff (R28).

    A missing table is not retried (``NoSuchTableError`` is raised at once).
    """
    from pyiceberg.exceptions import NoSuchTableError
    from tenacity import retry, retry_if_not_exception_type, stop_after_attempt, wait_exponential

    @retry(
        retry=retry_if_not_exception_type(NoSuchTableError),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=wait_s, max=10),
        reraise=True,
    )
    def load() -> Table:
        return catalog.load_table(identifier)

    return load()


def commit_data(
    catalog: Catalog,
    plan: Plan,
    files: list[DataFile],
    properties: dict[str, str],
    hooks: FailureHooks = NO_HOOKS,
    max_attempts: int = 5,
    backoff_s: Callable[[int], float] = lambda attempt: min(2.0, 0.1 * 2**attempt),
    witness: Witness | None = None,
    apply: ApplyChanges | None = None,
) -> CommitOutcome:
    """Commit ``files`` with the plan's next offsets, exactly once (``witness``: one of their
    rows, kept with the position table property, R56).

    ``apply``, when given, makes the snapshot instead of appending ``files`` (``mode:
    upsert``, ingestion.table.upsert.ApplyChanges): on each attempt's freshly loaded head,
    after the checks below, ``apply.prepare`` plans (a failure there is a named error, nothing
    committed), then ``apply(table, properties)`` commits against that head without retrying,
    raising ``CommitFailedException`` when the head moved.

    Delivery: idempotent. If the plan's commit id is already in the table's ancestry the
    existing snapshot is returned (R5). If another commit moved the group's offsets since the
    plan, this attempt's files are deleted and :class:`CommitConflictError` names the winner
    (R7, R8). After an ambiguous catalog error the table is searched for the commit id; if it is
    absent, :class:`CommitOutcomeUnknownError` is raised and no file is deleted (R3).
    """
    from pyiceberg.exceptions import CommitFailedException, NoSuchTableError

    _check_no_regression(plan)
    group = plan.group_id
    for attempt in range(1, max_attempts + 1):
        try:
            table = load_table_with_retry(catalog, plan.table)
        except NoSuchTableError as exc:
            raise exceptions.TableDroppedError(
                f"pipeline {plan.pipeline!r}: table {plan.table} was dropped during the run; "
                "nothing was committed"
            ) from exc
        if str(table.metadata.table_uuid) != plan.table_uuid:
            raise exceptions.TableDroppedError(
                f"pipeline {plan.pipeline!r}: table {plan.table} was recreated during the run "
                f"(uuid {table.metadata.table_uuid}, planned {plan.table_uuid}); nothing committed"
            )
        existing = find_landed_commit(table, plan.commit_id, [group])
        if existing is not None:
            return CommitOutcome(existing, replayed=True, attempts=attempt)
        current = find_committed_state(table, group)
        if (current.offsets if current else None) != plan.committed:
            delete_files(table, files)
            winner = current.describe() if current else "a rollback past the group's commits"
            raise exceptions.CommitConflictError(
                f"pipeline {plan.pipeline!r}: group {group!r} offsets moved since the plan (by "
                f"the {winner}); this attempt ({plan.commit_id}) was aborted and its "
                f"{len(files)} files deleted"
            )
        retirement = find_retirement(table, group)
        if retirement is not None:  # a migration carried the offsets to another group (R22)
            delete_files(table, files)
            raise exceptions.CommitConflictError(
                f"pipeline {plan.pipeline!r}: group {group!r} was retired since the plan by the "
                f"{retirement.description}; this attempt ({plan.commit_id}) was aborted and its "
                f"{len(files)} files deleted. Set consumer_group_id: {retirement.successor}"
            )
        if apply is not None:  # outside the catalog call: its errors are not ambiguous
            apply.prepare(table, plan.pipeline)
        try:
            hooks.fire("before_catalog_call", plan=plan)
            if apply is None:
                snapshot_id = append_files(table, files, properties, witness)
            else:
                snapshot_id = apply(table, properties)
            hooks.fire("after_catalog_call", plan=plan, snapshot_id=snapshot_id)
        except CommitFailedException:
            time.sleep(backoff_s(attempt))  # the head moved (R27): refresh and re-check
            continue
        except Exception as exc:  # ambiguous: the catalog may or may not have applied it (R3)
            reloaded = load_table_with_retry(catalog, plan.table)
            found = find_landed_commit(reloaded, plan.commit_id, [group])
            if found is not None:
                return CommitOutcome(found, replayed=False, attempts=attempt)
            raise exceptions.CommitOutcomeUnknownError(
                f"pipeline {plan.pipeline!r}: the catalog call failed ({exc!r}) and commit "
                f"{plan.commit_id} is not in the table; files were kept. The next run re-plans."
            ) from exc
        return CommitOutcome(snapshot_id, replayed=False, attempts=attempt)
    raise exceptions.CommitConflictError(
        f"pipeline {plan.pipeline!r}: table {plan.table} kept changing; gave up after "
        f"{max_attempts} attempts with nothing committed"
    )
