"""The operator's release of a late-copy record (R54) on a real SQL catalog: every entry of the
route in force is released in one empty snapshot recording who, why and how many (per cluster);
refused with nothing changed when no record is in force, or once released; the record of a route
no longer in force is not released."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pyiceberg.catalog import Catalog

from ingestion.dr.late_copies.guard import RELEASED, UNCOPIED_PREFIX, read_guard
from ingestion.dr.late_copies.release import release_guard
from ingestion.exceptions import OperationRefusedError
from ingestion.table.offsets import (
    FAILOVER_TO,
    RESET_BY,
    RESET_REASON,
    TopicOffsets,
    commit_properties,
    snapshot_properties,
)
from ingestion.table.schema import load_or_create_table
from resources.iceberg import IcebergCatalogResource
from tests.support.pipelines import make_spec

SPEC = make_spec("orders", "release", replicas=[{"name": "dr", "source_alias": "primary"}])
GROUP = SPEC.consumer_group_id
GUARD = {
    "to": "dr",
    "partitions": [
        {
            "topic": "primary.orders",
            "partition": 0,
            "from": "primary",
            "source_topic": "orders",
            "records": [[3, 1000, "a"], [4, 1001, "b"]],
        },
        {
            "topic": "primary.orders",
            "partition": 0,
            "from": "dr",
            "source_topic": "primary.orders",
            "records": [[9, 1002, "c"]],
        },
        {
            "topic": "primary.orders",
            "partition": 1,
            "from": "primary",
            "source_topic": "orders",
            "records": [[7, 1003, None]],
        },
    ],
}


def commit(catalog: Catalog, cluster: str, **extra: str) -> None:
    table = load_or_create_table(catalog, SPEC)
    properties = commit_properties(
        group_id=GROUP,
        offsets={"orders": TopicOffsets("id", {0: 5})},
        commit_id=cluster,
        cluster_id=cluster,
        pipeline=SPEC.name,
    )
    with (
        table.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties={**properties, **extra}).fast_append(),
    ):
        pass


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    """A table failed over to dr with --source-lost: its uncopied records in force."""
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    commit(catalog, "k-primary")
    commit(catalog, "k-dr", **{FAILOVER_TO: "dr", RESET_BY: "ops"})
    with catalog.load_table(SPEC.table).transaction() as transaction:
        transaction.set_properties({UNCOPIED_PREFIX + GROUP: orjson.dumps(GUARD).decode()})
    return catalog


def test_a_release_drops_every_entry_and_records_who_why_and_how_many(catalog: Catalog) -> None:
    before = catalog.load_table(SPEC.table)
    assert read_guard(before, GROUP, SPEC.name) is not None
    assert release_guard(catalog, SPEC, "ops", "dr is gone") == (4, {"primary": 3, "dr": 1})
    table = catalog.load_table(SPEC.table)
    assert read_guard(table, GROUP, SPEC.name) is None
    value = orjson.loads(table.properties[UNCOPIED_PREFIX + GROUP])
    assert value["partitions"] == []
    assert value["released"] == {
        "by": "ops",
        "reason": "dr is gone",
        "records": 4,
        "clusters": {"primary": 3, "dr": 1},
    }
    head = table.current_snapshot()
    assert head is not None
    assert head.parent_snapshot_id == before.metadata.current_snapshot_id
    properties = snapshot_properties(head)
    assert (properties[RELEASED], properties[RESET_BY], properties[RESET_REASON]) == (
        "4",
        "ops",
        "dr is gone",
    )
    assert head.summary is not None
    assert "added-records" not in head.summary.additional_properties  # an empty snapshot


def test_a_second_release_is_refused_and_changes_nothing(catalog: Catalog) -> None:
    release_guard(catalog, SPEC, "ops", "first")
    snapshots = len(catalog.load_table(SPEC.table).metadata.snapshots)
    with pytest.raises(OperationRefusedError, match="no record of uncopied records is in force"):
        release_guard(catalog, SPEC, "ops", "again")
    assert len(catalog.load_table(SPEC.table).metadata.snapshots) == snapshots


def test_the_record_of_a_route_no_longer_in_force_is_not_released(catalog: Catalog) -> None:
    commit(catalog, "k-primary", **{RESET_BY: "ops"})  # a reset back on the primary
    with pytest.raises(OperationRefusedError, match="nothing changed"):
        release_guard(catalog, SPEC, "ops", "late")
    value = orjson.loads(catalog.load_table(SPEC.table).properties[UNCOPIED_PREFIX + GROUP])
    assert len(value["partitions"]) == 3


def test_a_switch_planned_before_a_release_is_refused_not_undoing_it(catalog: Catalog) -> None:
    """A failover read the record (to carry it over) and planned; a release committed; the
    switch's commit then finds the head moved without the group's offsets moving. It must not
    write back the record the release cleared: refused, the release stands (the switch's
    commit as ``ingestion.dr.switch.apply_failover`` builds it)."""
    import uuid

    from ingestion.exceptions import CommitConflictError
    from ingestion.ops.action import ActionCommit, commit_action
    from ingestion.table.offsets import COMMIT_ID, find_committed_state

    key = UNCOPIED_PREFIX + GROUP
    planned = catalog.load_table(SPEC.table)
    state = find_committed_state(planned, GROUP)
    assert state is not None
    carried = planned.properties[key]
    switch = ActionCommit(
        SPEC.name,
        "failover to 'primary'",
        SPEC.table,
        str(planned.metadata.table_uuid),
        {GROUP: state.offsets},
        {COMMIT_ID: uuid.uuid4().hex, FAILOVER_TO: "primary"},
        table_properties={key: carried},
        planned_properties={key: carried},
    )
    release_guard(catalog, SPEC, "ops", "primary rebuilt")
    released = catalog.load_table(SPEC.table)
    with pytest.raises(CommitConflictError, match=f"table property '{key}' changed"):
        commit_action(catalog, switch)
    after = catalog.load_table(SPEC.table)
    assert after.current_snapshot() == released.current_snapshot()
    assert read_guard(after, GROUP, SPEC.name) is None  # still released
