"""The route a table records, read back from real snapshots (SQL catalog): no switch reads the
primary; a switch moves the group to its cluster and topic names, and runs carrying the route
keep it; a later commit under another cluster id, or a failback's completion, ends it; the
completion's dropped topics outlive its snapshot in a table property."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pyiceberg.table import Table

from ingestion.table.offsets import FAILOVER_TO, TopicOffsets, commit_properties
from ingestion.table.route import (
    DROPPED_PREFIX,
    FAILOVER_ORIGIN,
    FAILOVER_TOPICS,
    PRIMARY,
    REPLACED_SNAPSHOT,
    ROUTE,
    ROUTE_ENDED,
    SWITCH_SNAPSHOT,
    active_cluster,
    active_origins,
    active_switch,
    active_topics,
    ended_topics,
    route_cluster,
    route_of,
)
from ingestion.table.schema import load_or_create_table
from resources.iceberg import IcebergCatalogResource
from tests.support.pipelines import make_spec

GROUP = "g"


@pytest.fixture
def table(tmp_path: Path) -> Table:
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    return load_or_create_table(catalog, make_spec("orders", "route"))


def commit(table: Table, cluster_id: str, next_offset: int, **extra: str) -> int:
    """An empty commit of the group's offsets under ``cluster_id``; return its snapshot id."""
    properties = commit_properties(
        group_id=GROUP,
        offsets={"orders": TopicOffsets("id", {0: next_offset})},
        commit_id=f"c{len(table.metadata.snapshots)}",
        cluster_id=cluster_id,
        pipeline="route",
    )
    with (
        table.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties={**properties, **extra}).fast_append(),
    ):
        pass
    assert table.metadata.current_snapshot_id is not None
    return table.metadata.current_snapshot_id


def moved_route(table: Table) -> tuple[int, int]:
    """A run on the primary, then a failover to dr reading ``primary.orders`` (switch), then
    a run on dr carrying the route; return (run on the primary, switch) snapshot ids."""
    first = commit(table, "k-primary", 10)
    topics = orjson.dumps({"orders": "primary.orders"}).decode()
    switch = commit(table, "k-dr", 8, **{FAILOVER_TO: "dr", FAILOVER_TOPICS: topics})
    carried = orjson.dumps({FAILOVER_TO: "dr", FAILOVER_TOPICS: topics}).decode()
    commit(table, "k-dr", 12, **{ROUTE: carried})
    return first, switch


def test_without_a_switch_the_group_reads_its_own_cluster(table: Table) -> None:
    assert route_cluster(table, GROUP) == PRIMARY  # not even a commit yet
    commit(table, "k-primary", 10)
    assert active_switch(table, GROUP) is None
    assert active_cluster(table, GROUP) is None
    assert active_topics(table, GROUP) is None
    assert active_origins(table, GROUP) == []
    assert route_cluster(table, GROUP) == PRIMARY
    assert ended_topics(table, GROUP) is None


def test_a_switch_moves_the_route_and_runs_carrying_it_keep_it(table: Table) -> None:
    first, switch = moved_route(table)
    assert route_cluster(table, GROUP) == active_cluster(table, GROUP) == "dr"
    assert active_topics(table, GROUP) == {"orders": "primary.orders"}
    route = active_switch(table, GROUP)
    assert route is not None
    assert route[FAILOVER_TO] == "dr"
    # Named from the carried copy: no switch snapshot id is added by a run's commit.
    assert SWITCH_SNAPSHOT not in route
    # With only the switch at the head, it names itself and the offsets it replaced.
    table.manage_snapshots().set_current_snapshot(switch).commit()
    route = active_switch(table, GROUP)
    assert route is not None
    assert (route[SWITCH_SNAPSHOT], route[REPLACED_SNAPSHOT]) == (str(switch), str(first))


def test_another_groups_switch_does_not_move_this_one(table: Table) -> None:
    commit(table, "k-primary", 10)
    other = commit_properties(
        group_id="other",
        offsets={"orders": TopicOffsets("id", {0: 1})},
        commit_id="o",
        cluster_id="k-dr",
        pipeline="other",
    )
    with (
        table.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties={**other, FAILOVER_TO: "dr"}).fast_append(),
    ):
        pass
    assert route_cluster(table, GROUP) == PRIMARY


def test_a_later_commit_under_another_cluster_id_ends_the_route(table: Table) -> None:
    moved_route(table)
    commit(table, "k-primary", 5, **{"kafka.reset-by": "ops"})  # a reset back on the primary
    assert active_switch(table, GROUP) is None
    assert route_cluster(table, GROUP) == PRIMARY


def test_a_failbacks_completion_ends_the_route_and_names_what_it_dropped(table: Table) -> None:
    moved_route(table)
    origin = orjson.dumps([{"topic": "orders", "partition": 0}]).decode()
    topics = orjson.dumps({"orders": "dr.orders"}).decode()
    commit(
        table,
        "k-primary",
        20,
        **{FAILOVER_TO: PRIMARY, FAILOVER_TOPICS: topics, FAILOVER_ORIGIN: origin},
    )
    assert route_cluster(table, GROUP) == PRIMARY  # a failback is a switch too
    assert active_origins(table, GROUP) == ["orders"]
    assert ended_topics(table, GROUP) is None
    done = commit(table, "k-primary", 21, **{ROUTE_ENDED: '{"dr.orders:0":40}'})
    assert active_switch(table, GROUP) is None
    assert active_origins(table, GROUP) == []
    assert ended_topics(table, GROUP) == (done, {"dr.orders"})


def test_the_dropped_topics_outlive_the_completions_snapshot(table: Table) -> None:
    commit(table, "k-primary", 10)
    with table.transaction() as transaction:
        transaction.set_properties({DROPPED_PREFIX + GROUP: '{"dr.orders:0":40,"dr.x:1":3}'})
    assert ended_topics(table, GROUP) == (-1, {"dr.orders", "dr.x"})
    assert ended_topics(table, "other") is None


def test_a_carried_route_reads_as_the_switch_recorded_it() -> None:
    switch = {FAILOVER_TO: "dr", FAILOVER_TOPICS: '{"o":"p.o"}', "kafka.records": "3"}
    recorded = route_of(switch)
    assert recorded == {FAILOVER_TO: "dr", FAILOVER_TOPICS: '{"o":"p.o"}'}
    assert route_of({ROUTE: orjson.dumps(recorded).decode()}) == recorded
