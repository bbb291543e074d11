"""The quarantine sync's plan (pure, no broker): which quarantine commits bring the quarantine
table up to the data table after runs, resets, rollbacks (R32) and snapshot expiry."""

from __future__ import annotations

import pytest

from ingestion.quarantine.plan import SourceCommit, plan_sync
from ingestion.table.offsets import TopicOffsets

P0, P1 = ("t", 0), ("t", 1)


def commit(
    sequence: int, name: str, p0: int, p1: int | None = None, files: int = 0
) -> SourceCommit:
    """A data commit with offsets for partition 0 (and 1) that names ``files`` files."""
    parts = {0: p0} if p1 is None else {0: p0, 1: p1}
    return SourceCommit(
        sequence, name, {"t": TopicOffsets("id", parts)}, tuple(f"{name}-{i}" for i in range(files))
    )


@pytest.mark.parametrize(
    ("synced", "newer", "before", "head", "expected"),
    [
        pytest.param(
            {P0: 10},
            [commit(5, "a", 20), commit(6, "b", 30)],
            {P0: 10},
            None,
            [],
            id="clean-commits-need-nothing",
        ),
        pytest.param(
            {},
            [commit(1, "c1", 10, files=1), commit(2, "r", 5), commit(3, "c2", 10, files=1)],
            {},
            None,
            [("c1", {}), ("r", {P0: 5}), ("c2", {})],
            id="fresh-table-replays-a-rewind-in-order",
        ),
        pytest.param(
            {P0: 20},
            [],
            {P0: 10},
            commit(3, "kept", 10),
            [("kept", {P0: 10})],
            id="rolled-back-no-new-commit-truncates",
        ),
        pytest.param(
            {P0: 20},
            [commit(9, "again", 15, files=1)],
            {P0: 10},
            None,
            [("again", {P0: 10})],
            id="rolled-back-then-a-run-cuts-at-the-rollback-point",
        ),
        pytest.param(
            {P0: 10},
            [commit(7, "after-expiry", 20, files=1)],
            None,
            None,
            [("after-expiry", {})],
            id="expired-predecessor-cuts-nothing-below",
        ),
        pytest.param(
            {P0: 10, P1: 8},
            [],
            {P0: 10},
            commit(4, "before-p1", 10),
            [("before-p1", {P1: 0})],
            id="partition-unknown-to-the-head-is-emptied",
        ),
        pytest.param(
            {P0: 10},
            [],
            {},
            None,
            [("", {P0: 0})],
            id="table-without-commits-empties-the-quarantine",
        ),
        pytest.param(
            {P0: 10},
            [],
            None,
            None,
            [],
            id="every-commit-expired-by-another-tool-cuts-nothing",  # R56
        ),
        pytest.param(
            {P0: 10, P1: 8},
            [commit(5, "reset-drops-p1", 4)],
            {P0: 10, P1: 8},
            None,
            [("reset-drops-p1", {P0: 4})],
            id="partition-a-reset-drops-keeps-its-dead-letters",
        ),
        pytest.param(
            {P0: 10, P1: 8},
            [commit(5, "drops-p1", 12), commit(6, "brings-p1-back", 14, 8)],
            {P0: 10, P1: 8},
            None,
            [],
            id="partition-dropped-then-brought-back-where-it-was-keeps-its-dead-letters",
        ),
        pytest.param(
            {P0: 10, P1: 8},
            [commit(5, "drops-p1", 12), commit(6, "brings-p1-back-lower", 14, 3)],
            {P0: 10, P1: 8},
            None,
            [("brings-p1-back-lower", {P1: 3})],
            id="partition-brought-back-below-where-it-was-is-a-rewind",
        ),
    ],
)
def test_plan_sync(
    synced: dict[tuple[str, int], int],
    newer: list[SourceCommit],
    before: dict[tuple[str, int], int] | None,
    head: SourceCommit | None,
    expected: list[tuple[str, dict[tuple[str, int], int]]],
) -> None:
    steps = plan_sync(synced, newer, before, head)
    assert [(s.commit.commit_id, s.cuts) for s in steps] == expected


def on(sequence: int, name: str, cluster: str, p0: int, files: int = 0) -> SourceCommit:
    """A commit of topic ``t`` partition 0 read on ``cluster`` (its own topic id there)."""
    names = tuple(f"{name}-{i}" for i in range(files))
    offsets = {"t": TopicOffsets(f"{cluster}-id", {0: p0})}
    return SourceCommit(sequence, name, offsets, names, cluster)


@pytest.mark.parametrize(
    ("newer", "head", "expected"),
    [
        pytest.param(
            [on(9, "failback", "primary", 76), on(10, "run", "primary", 79)],
            None,
            [],
            id="switch-to-a-same-named-topic-is-no-rewind",
        ),
        pytest.param(
            [on(9, "failback", "primary", 76), on(10, "run", "primary", 80, files=1)],
            None,
            [("run", {})],
            id="switched-topic-adds-its-dead-letters-and-keeps-the-others",
        ),
        pytest.param(
            [on(9, "failback", "primary", 76, files=0), on(10, "reset", "primary", 70)],
            None,
            [],
            id="a-rewind-on-the-new-cluster-cuts-nothing-read-on-the-old-one",
        ),
        pytest.param(
            [on(9, "reset", "dr", 76)],
            None,
            [("reset", {P0: 76})],
            id="rewind-of-the-same-topic-still-cuts",
        ),
        pytest.param(
            [],
            on(9, "failback", "primary", 76),
            [],
            id="no-truncation-to-a-switch-to-another-topic",
        ),
        pytest.param(
            [
                on(9, "to-primary", "primary", 40),
                on(10, "run", "primary", 60),
                on(11, "back-to-dr", "dr", 100),
                on(12, "run", "dr", 110, files=1),
            ],
            None,
            [("run", {})],
            id="a-topic-read-on-the-other-cluster-meanwhile-sets-no-cut-on-return",
        ),
    ],
)
def test_plan_sync_keeps_dead_letters_of_another_topic_with_the_same_name(
    newer: list[SourceCommit],
    head: SourceCommit | None,
    expected: list[tuple[str, dict[tuple[str, int], int]]],
) -> None:
    """MM2's identity naming on the way back: ``primary.orders`` on the replica and on the
    primary are two topics on two clusters; the failback's lower offsets are not a rewind of
    the rows read on the replica (the k141 loss of the failback test)."""
    steps = plan_sync({P0: 90}, newer, {P0: 90}, head, "dr")
    assert [(s.commit.commit_id, s.cuts) for s in steps] == expected


@pytest.mark.parametrize("synced_cluster", [None, ""], ids=["no-state", "empty"])
@pytest.mark.parametrize("before", [{P0: 90}, None], ids=["before-known", "before-expired"])
def test_a_state_without_a_cluster_cuts_nothing_on_a_forward_run(
    synced_cluster: str | None, before: dict[tuple[str, int], int] | None
) -> None:
    """A quarantine state written before clusters were recorded, then a run that records one:
    its offsets go forward, so every dead letter stays."""
    steps = plan_sync({P0: 90}, [on(9, "run", "K", 100, files=1)], before, None, synced_cluster)
    assert [(s.commit.commit_id, s.cuts) for s in steps] == [("run", {})]


@pytest.mark.parametrize(
    ("newer", "expected"),
    [
        pytest.param(
            [on(9, "failback", "primary", 76), on(10, "run", "primary", 79)],
            [],
            id="switch-to-a-same-named-topic-is-still-no-rewind",
        ),
        pytest.param(
            [on(9, "failback", "primary", 76), on(10, "reset", "primary", 70)],
            [("reset", {P0: 70})],
            id="a-rewind-on-the-new-cluster-cuts-its-own-rows",
        ),
        pytest.param(
            [on(9, "failback", "primary", 76), on(10, "reset", "primary", 80)],
            [],
            id="a-forward-reset-on-the-new-cluster-cuts-nothing",
        ),
    ],
)
def test_labelled_rows_let_each_cluster_cut_its_own_rows(
    newer: list[SourceCommit], expected: list[tuple[str, dict[tuple[str, int], int]]]
) -> None:
    """Rows that record their cluster (``_kafka_cluster``): a rewind on the cluster the
    pipeline switched to cuts that cluster's dead letters, which it reads again, even while the
    last synced commit was read on the other one (no dead letter since the failback); the cut
    deletes only that cluster's rows (``ingestion.quarantine.sync.apply_step``)."""
    steps = plan_sync({P0: 90}, newer, {P0: 90}, None, "dr", labelled=True)
    assert [(s.commit.commit_id, s.cuts) for s in steps] == expected
