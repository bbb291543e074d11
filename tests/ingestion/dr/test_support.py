"""Disaster recovery as the core asks for it (``ReplicaSupport``), on real Iceberg snapshots:
the route checks of a run (R49), the late-copy guard of a ``--source-lost`` switch handed to
each task as its record guard and its candidates refused while their cluster cannot be read
(R54), the route a commit carries, and the audit's name families."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from ingestion.dr.align import key_digest
from ingestion.dr.late_copies.guard import UNCOPIED_PREFIX
from ingestion.dr.late_copies.task import LateCopyScreen
from ingestion.dr.support import DisasterRecovery, LateCopyRunGuard
from ingestion.exceptions import LateCopyUnverifiedError, RouteClusterError
from ingestion.table.offsets import (
    FAILOVER_TO,
)
from ingestion.table.route import FAILOVER_TOPICS, ROUTE
from ingestion.task.spec import RawChunk
from tests.support.history import group_commit, table_with_history
from tests.support.pipelines import make_spec

GROUP = "g"
SPEC = make_spec(
    "orders", "sup", consumer_group_id=GROUP, replicas=[{"name": "dr", "source_alias": "primary"}]
)
SUPPORT = DisasterRecovery()


ON_PRIMARY = group_commit(GROUP, "pri", {"orders": 3})
TO_DR = group_commit(
    GROUP,
    "dr",
    {"primary.orders": 5},
    **{FAILOVER_TO: "dr", FAILOVER_TOPICS: '{"orders": "primary.orders"}'},
)
# A --source-lost failover's record of 2 records the replica never got (read on the primary).
UNCOPIED = {
    "to": "dr",
    "partitions": [
        {
            "topic": "primary.orders",
            "partition": 0,
            "from": "primary",
            "source_topic": "orders",
            "records": [[3, 1000, key_digest(b"k3")], [4, 1001, key_digest(b"k4")]],
        }
    ],
}


def test_a_run_on_the_primary_needs_no_guard_and_carries_no_route(tmp_path: Path) -> None:
    table = table_with_history(tmp_path, ON_PRIMARY)
    SUPPORT.check_route(table, GROUP, SPEC, ["orders"], "primary")
    assert SUPPORT.run_guard(table, GROUP, SPEC.name, None) is None
    assert SUPPORT.commit_properties(table, GROUP) == {}
    assert SUPPORT.name_families(SPEC) == [frozenset({"orders", "primary.orders"})]


def test_a_run_on_a_moved_route_must_read_its_cluster_and_carries_it(tmp_path: Path) -> None:
    table = table_with_history(tmp_path, ON_PRIMARY, TO_DR)
    SUPPORT.check_route(table, GROUP, SPEC, ["orders"], "dr")
    with pytest.raises(RouteClusterError, match="told it reads cluster 'primary'"):
        SUPPORT.check_route(table, GROUP, SPEC, ["orders"], "primary")
    carried = orjson.loads(SUPPORT.commit_properties(table, GROUP)[ROUTE])
    assert carried[FAILOVER_TO] == "dr"


def test_each_guarded_partitions_task_screens_out_the_candidates(tmp_path: Path) -> None:
    table = table_with_history(tmp_path, ON_PRIMARY, TO_DR)
    with table.transaction() as transaction:
        transaction.set_properties({UNCOPIED_PREFIX + GROUP: orjson.dumps(UNCOPIED).decode()})
    guard = SUPPORT.run_guard(table, GROUP, SPEC.name, None)
    assert isinstance(guard, LateCopyRunGuard)
    ((key, screen),) = guard.task_guards().items()
    assert key == ("primary.orders", 0)
    assert isinstance(screen, LateCopyScreen)
    assert screen.needs_headers  # a late copy's identity covers its headers
    # Offset 11 has an uncopied record's timestamp and key: a candidate, held back.
    raw = RawChunk(
        offsets=[10, 11, 12],
        keys=[b"k3", b"k3", b"k9"],
        values=[b"a", b"b", b"c"],
        timestamps=[999, 1000, 1001],
        headers=[None, None, None],
    )
    kept, taken = screen.screen(raw, keep_headers=False)
    assert kept.offsets == [10, 12]
    assert (taken.candidates, taken.skipped) == (1, [])
    assert taken.met == {(1000, key_digest(b"k3"))}
    # Resolving needs the primary, which is not configured here: refused, nothing committed.
    with pytest.raises(LateCopyUnverifiedError, match="'primary' does not answer"):
        guard.resolve({key: taken.met})


def test_a_guard_of_a_route_no_longer_in_force_holds_nothing_back(tmp_path: Path) -> None:
    table = table_with_history(
        tmp_path, ON_PRIMARY, TO_DR, group_commit(GROUP, "pri", {"orders": 3})
    )  # a reset back
    with table.transaction() as transaction:
        transaction.set_properties({UNCOPIED_PREFIX + GROUP: orjson.dumps(UNCOPIED).decode()})
    assert SUPPORT.run_guard(table, GROUP, SPEC.name, None) is None
