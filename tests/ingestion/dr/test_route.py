"""A moved route at run time, on real Iceberg snapshots: what a run commit carries (the route,
with a failback's origin plan cut to its topic names), a run told another cluster than the
route's refused, and a run planned on a reverse copy a completion dropped refused, also once
expiry removed the completion (its table property says). The route's end across a failback is
in failback/test_complete.py."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from ingestion.dr.route import carried_route, refuse_ended_topics, refuse_other_cluster
from ingestion.exceptions import CommitConflictError, RouteClusterError
from ingestion.table.offsets import (
    FAILOVER_TO,
)
from ingestion.table.route import DROPPED_PREFIX, FAILOVER_ORIGIN, FAILOVER_TOPICS, ROUTE
from tests.support.history import group_commit, table_with_history

GROUP = "g"


ON_PRIMARY = group_commit(GROUP, "pri", {"o": 3})
TO_DR = group_commit(
    GROUP, "dr", {"east.o": 5}, **{FAILOVER_TO: "dr", FAILOVER_TOPICS: '{"o": "east.o"}'}
)


def test_without_a_switch_a_run_carries_nothing_and_reads_the_primary(tmp_path: Path) -> None:
    table = table_with_history(tmp_path, ON_PRIMARY)
    assert carried_route(table, GROUP) == {}
    refuse_other_cluster(table, GROUP, "primary", "p")
    with pytest.raises(
        RouteClusterError, match="told it reads cluster 'dr', the table's route reads 'primary'"
    ):
        refuse_other_cluster(table, GROUP, "dr", "p")


def test_a_run_on_a_moved_route_carries_it_and_must_read_its_cluster(tmp_path: Path) -> None:
    table = table_with_history(tmp_path, ON_PRIMARY, TO_DR)
    carried = carried_route(table, GROUP)
    route = orjson.loads(carried[ROUTE])
    assert route[FAILOVER_TO] == "dr"
    assert route[FAILOVER_TOPICS] == '{"o": "east.o"}'
    refuse_other_cluster(table, GROUP, "dr", "p")
    with pytest.raises(RouteClusterError, match="told it reads cluster 'primary'"):
        refuse_other_cluster(table, GROUP, "primary", "p")
    # A run's commit carrying it keeps the route after the switch (expired or not).
    table_after = table_with_history(
        tmp_path / "after", ON_PRIMARY, group_commit(GROUP, "dr", {"east.o": 9}, **carried)
    )
    assert orjson.loads(carried_route(table_after, GROUP)[ROUTE])[FAILOVER_TO] == "dr"


def test_a_failbacks_origin_plan_is_carried_as_its_topic_names_only(tmp_path: Path) -> None:
    plan = [
        {"topic": "o", "partition": 0, "resume": 12, "tail": 3},
        {"topic": "o", "partition": 1, "resume": 4, "tail": 0},
        {"topic": "a", "partition": 0, "resume": 1, "tail": 1},
    ]
    origin = orjson.dumps(plan).decode()
    back = group_commit(
        GROUP, "pri", {"o": 12}, **{FAILOVER_TO: "primary", FAILOVER_ORIGIN: origin}
    )
    table = table_with_history(tmp_path, ON_PRIMARY, TO_DR, back)
    route = orjson.loads(carried_route(table, GROUP)[ROUTE])
    assert orjson.loads(route[FAILOVER_ORIGIN]) == [{"topic": "a"}, {"topic": "o"}]


def test_a_run_planned_on_a_dropped_reverse_copy_is_refused_after_expiry_too(
    tmp_path: Path,
) -> None:
    """The completion's snapshot is gone: the table property names what it dropped."""
    table = table_with_history(tmp_path, group_commit(GROUP, "pri", {"o": 12}))
    with table.transaction() as transaction:
        transaction.set_properties({DROPPED_PREFIX + GROUP: '{"east.o:0":4}'})
    with pytest.raises(CommitConflictError) as refused:
        refuse_ended_topics(table, GROUP, ["east.o", "o"], ["east.o"], "p")
    assert "the failback was completed: the reverse copies ['east.o'] are no longer read" in str(
        refused.value
    )
    refuse_ended_topics(table, GROUP, ["o", "new"], ["new"], "p")  # a new topic: goes ahead
