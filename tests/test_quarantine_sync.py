"""The quarantine sync's plan (pure, no broker): which quarantine commits bring the quarantine
table up to the data table after runs, resets, rollbacks (R32) and snapshot expiry."""

from __future__ import annotations

import pytest

from ingestion.offsets import TopicOffsets
from ingestion.quarantine_plan import SourceCommit, plan_sync

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
