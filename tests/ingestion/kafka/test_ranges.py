"""Offset ranges, pure: the fair cap on what one run plans (R21) and the split of each
partition's range into tasks that tile it (R1)."""

from __future__ import annotations

import itertools

import pytest

from ingestion.kafka.ranges import OffsetRange, cap_ends, split_tasks


@pytest.mark.parametrize(
    ("ends", "cap", "expected"),
    [
        ({0: 10, 1: 10}, None, {0: 10, 1: 10}),
        ({0: 10, 1: 10}, 100, {0: 10, 1: 10}),
        ({0: 10, 1: 10}, 7, {0: 4, 1: 3}),
        ({0: 10, 1: 2}, 8, {0: 6, 1: 2}),
        ({0: 0, 1: 5, 2: 5}, 4, {0: 0, 1: 2, 2: 2}),
    ],
)
def test_cap_shares_the_budget_fairly(
    ends: dict[int, int], cap: int | None, expected: dict[int, int]
) -> None:
    """R21: at most ``cap`` offsets, shared by water-filling."""
    start = {("t", p): 0 for p in ends}
    capped = cap_ends(start, {("t", p): e for p, e in ends.items()}, cap)
    assert {p: capped[("t", p)] for p in ends} == expected
    assert sum(capped.values()) <= (cap if cap is not None else sum(ends.values()))


@pytest.mark.parametrize(("size", "count"), [(1, 7), (3, 3), (7, 1), (100, 1)])
def test_split_tiles_the_range(size: int, count: int) -> None:
    """R1: tasks tile [start, end) with no gap or overlap."""
    tasks = split_tasks({("t", 0): 3}, {("t", 0): 10}, size)
    assert len(tasks) == count
    assert tasks[0].start == 3
    assert tasks[-1].end == 10
    assert all(a.end == b.start for a, b in itertools.pairwise(tasks))


def test_a_cap_counts_from_each_partitions_start() -> None:
    """Partitions that start apart share the offsets still to read, not the end offsets."""
    start = {("t", 0): 90, ("t", 1): 0}
    capped = cap_ends(start, {("t", 0): 100, ("t", 1): 100}, 12)
    assert capped == {("t", 0): 96, ("t", 1): 6}


def test_tasks_come_in_partition_order_and_an_empty_range_has_none() -> None:
    start = {("b", 0): 0, ("a", 1): 4, ("a", 0): 7}
    tasks = split_tasks(start, {("b", 0): 2, ("a", 1): 4, ("a", 0): 9}, 5)
    assert tasks == [OffsetRange("a", 0, 7, 9), OffsetRange("b", 0, 0, 2)]
    assert [t.size for t in tasks] == [2, 2]
