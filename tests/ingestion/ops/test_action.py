"""An operator action's compare-and-set commit (``commit_action``) on a real SQL catalog: applied
once on the head it checked, retried when the head moved without touching the guarded offsets,
aborted naming the commit that moved them (or the migration that retired the group), refused on
a dropped or recreated table; a delete that matches nothing still records the action."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table

from ingestion.exceptions import CommitConflictError, TableDroppedError
from ingestion.ops.action import (
    ActionCommit,
    commit_action,
    mirror_after,
    read_group_before,
    refuse_active_runs,
)
from ingestion.pipeline.hooks import FailureHooks
from ingestion.table.offsets import (
    RESET_BY,
    RETIRED_GROUPS,
    TopicOffsets,
    commit_properties,
    find_committed_state,
    snapshot_properties,
)
from ingestion.table.schema import load_or_create_table
from resources.iceberg import IcebergCatalogResource
from tests.support.pipelines import make_spec

SPEC = make_spec("orders", "act")
GROUP = SPEC.consumer_group_id


def offsets(next_offset: int) -> dict[str, TopicOffsets]:
    return {"orders": TopicOffsets("id", {0: next_offset})}


def run_commit(table: Table, first: int, end: int, commit_id: str) -> None:
    """A run's commit: rows ``first .. end - 1`` of ``orders[0]`` and the group's offsets."""
    at = dt.datetime(2026, 11, 23, tzinfo=dt.UTC)
    rows = [
        {
            "id": o,
            "ts": at,
            "_kafka_topic": "orders",
            "_kafka_partition": 0,
            "_kafka_offset": o,
            "_kafka_timestamp": at,
            "_kafka_key": f"k{o}",
        }
        for o in range(first, end)
    ]
    properties = commit_properties(
        group_id=GROUP,
        offsets=offsets(end),
        commit_id=commit_id,
        cluster_id="k",
        pipeline=SPEC.name,
        run_id=commit_id,
    )
    table.append(pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema())), properties)


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    """A fresh embedded catalog whose table holds one run's commit: offsets 0..9, next 10."""
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    run_commit(load_or_create_table(catalog, SPEC), 0, 10, "run1")
    return catalog


def rewind_to_5(catalog: Catalog, commit_id: str = "reset1", **fields: Any) -> ActionCommit:
    """A reset of the group to offset 5, planned now: deletes the rows it will read again."""
    table = catalog.load_table(SPEC.table)
    planned = find_committed_state(table, GROUP)
    assert planned is not None
    properties = commit_properties(
        group_id=GROUP,
        offsets=offsets(5),
        commit_id=commit_id,
        cluster_id="k",
        pipeline=SPEC.name,
        requested_by="ops",
        reason="replay",
    )
    return ActionCommit(
        **{
            "pipeline": SPEC.name,
            "action": "offset reset",
            "table": SPEC.table,
            "table_uuid": str(table.metadata.table_uuid),
            "expected": {GROUP: planned.offsets},
            "properties": properties,
            "delete_filter": "_kafka_offset >= 5",
            **fields,
        }
    )


def committed_next(catalog: Catalog) -> int:
    state = find_committed_state(catalog.load_table(SPEC.table), GROUP)
    assert state is not None
    return state.offsets["orders"].next_offsets[0]


def offsets_in_table(catalog: Catalog) -> list[int]:
    rows = catalog.load_table(SPEC.table).scan().to_arrow()
    return sorted(rows.column("_kafka_offset").to_pylist())


def no_wait(attempt: int) -> float:
    return 0.0


def racing(commit: Callable[[], None], times: int = 1) -> tuple[FailureHooks, list[str]]:
    """Hooks that run ``commit`` just before the action's catalog call, the first ``times``."""
    fired: list[str] = []

    def race(point: str, **context: Any) -> None:
        fired.append(point)
        if len(fired) <= times:
            commit()

    return FailureHooks({"before_catalog_call": race}), fired


def test_an_action_commits_once_with_its_properties_and_deletes_the_rewound_rows(
    catalog: Catalog,
) -> None:
    action = rewind_to_5(catalog)
    snapshot_id = commit_action(catalog, action)
    table = catalog.load_table(SPEC.table)
    assert table.metadata.current_snapshot_id == snapshot_id
    assert committed_next(catalog) == 5
    assert offsets_in_table(catalog) == [0, 1, 2, 3, 4]
    head = table.current_snapshot()
    assert head is not None
    assert snapshot_properties(head)[RESET_BY] == "ops"
    # The same action again finds its commit: no second snapshot.
    assert commit_action(catalog, action) == snapshot_id
    assert len(catalog.load_table(SPEC.table).metadata.snapshots) == len(table.metadata.snapshots)


def test_a_delete_that_matches_nothing_records_the_action_in_an_empty_append(
    catalog: Catalog,
) -> None:
    """No warning escapes either (pytest makes warnings errors)."""
    action = rewind_to_5(
        catalog, delete_filter="_kafka_offset >= 100", table_properties={"owner": "ops"}
    )
    commit_action(catalog, action)
    table = catalog.load_table(SPEC.table)
    assert offsets_in_table(catalog) == list(range(10))
    assert committed_next(catalog) == 5
    assert table.properties["owner"] == "ops"
    head = table.current_snapshot()
    assert head is not None
    assert head.summary is not None
    assert head.summary.operation.value == "append"


def test_a_run_committed_since_the_plan_aborts_the_action_naming_it(catalog: Catalog) -> None:
    action = rewind_to_5(catalog)
    run_commit(catalog.load_table(SPEC.table), 10, 12, "run2")
    with pytest.raises(
        CommitConflictError,
        match="offsets moved since it was planned, by the commit run2 of run run2",
    ):
        commit_action(catalog, action)
    assert committed_next(catalog) == 12
    assert offsets_in_table(catalog) == list(range(12))  # nothing deleted


def test_a_run_racing_the_catalog_call_aborts_the_action_with_nothing_committed(
    catalog: Catalog,
) -> None:
    action = rewind_to_5(catalog)
    hooks, fired = racing(lambda: run_commit(catalog.load_table(SPEC.table), 10, 11, "run2"))
    with pytest.raises(CommitConflictError, match="commit run2"):
        commit_action(catalog, action, hooks, backoff_s=no_wait)
    assert fired == ["before_catalog_call"]  # the re-check refused before a second call
    assert committed_next(catalog) == 11


def test_a_commit_that_leaves_the_offsets_alone_makes_the_action_retry_on_the_new_head(
    catalog: Catalog,
) -> None:
    def unrelated() -> None:
        table = catalog.load_table(SPEC.table)
        with table.transaction() as transaction:
            transaction.set_properties({"touched": "yes"})
            with transaction.update_snapshot().fast_append():
                pass

    action = rewind_to_5(catalog)
    hooks, fired = racing(unrelated)
    snapshot_id = commit_action(catalog, action, hooks, backoff_s=no_wait)
    assert fired == ["before_catalog_call", "before_catalog_call"]
    table = catalog.load_table(SPEC.table)
    assert table.metadata.current_snapshot_id == snapshot_id
    assert table.properties["touched"] == "yes"  # applied on top of it, not over it
    assert committed_next(catalog) == 5


def test_an_action_gives_up_when_the_table_keeps_changing(catalog: Catalog) -> None:
    def unrelated() -> None:
        table = catalog.load_table(SPEC.table)
        with table.transaction() as transaction, transaction.update_snapshot().fast_append():
            pass

    hooks, fired = racing(unrelated, times=99)
    with pytest.raises(
        CommitConflictError, match="kept changing; the offset reset gave up after 3 attempts"
    ):
        commit_action(catalog, rewind_to_5(catalog), hooks, max_attempts=3, backoff_s=no_wait)
    assert len(fired) == 3
    assert committed_next(catalog) == 10


def test_a_migration_retiring_the_group_since_the_plan_aborts_the_action(
    catalog: Catalog,
) -> None:
    action = rewind_to_5(catalog, retired={GROUP: None})
    with catalog.load_table(SPEC.table).transaction() as transaction:
        migration = {RETIRED_GROUPS: GROUP, RESET_BY: "ops", "kafka.group-id": "new-group"}
        with transaction.update_snapshot(snapshot_properties=migration).fast_append():
            pass
    with pytest.raises(CommitConflictError, match="was retired or brought back"):
        commit_action(catalog, action)


def test_a_dropped_or_recreated_table_refuses_the_action(catalog: Catalog) -> None:
    action = rewind_to_5(catalog)
    catalog.drop_table(SPEC.table)
    with pytest.raises(TableDroppedError, match="was dropped"):
        commit_action(catalog, action)
    load_or_create_table(catalog, SPEC)
    with pytest.raises(TableDroppedError, match="was recreated since"):
        commit_action(catalog, action)
    assert catalog.load_table(SPEC.table).current_snapshot() is None


def test_runs_in_progress_refuse_an_action() -> None:
    with pytest.raises(CommitConflictError, match="2 run\\(s\\) in progress"):
        refuse_active_runs(SPEC, 2, "a reset")
    refuse_active_runs(SPEC, 0, "a reset")


def test_without_a_kafka_client_the_group_is_neither_read_nor_mirrored(catalog: Catalog) -> None:
    """The next run moves the group instead."""
    assert read_group_before(None, GROUP) is None
    assert mirror_after(None, catalog, SPEC, GROUP) is None
