"""Which offset ranges the incremental audit recounts for one commit (pure, R46): from the
previous commit's offsets, from ``kafka.range-starts`` for new partitions, after a recorded lost
range, and a lower bound where Kafka no longer holds the start."""

from __future__ import annotations

import pytest

from ingestion.audit.recount import Recount, parse_lost_ranges, plan_recount
from ingestion.kafka.ranges import OffsetRange
from ingestion.table.offsets import LOST_RANGES, RANGE_STARTS


def test_lost_ranges_parse_to_their_ends_and_malformed_items_are_ignored() -> None:
    text = "orders[0] [10, 20); my.topic[12] [0, 5);garbage; orders[1] [3, x)"
    assert parse_lost_ranges(text) == {("orders", 0): 20, ("my.topic", 12): 5}
    assert parse_lost_ranges("") == {}


def test_a_topic_name_with_brackets_keeps_them() -> None:
    assert parse_lost_ranges("odd[x][2] [4, 9)") == {("odd[x]", 2): 9}


@pytest.mark.parametrize(
    ("previous", "current", "properties", "log_starts", "expected"),
    [
        # The next commit: from the previous offsets to the new ones, exact.
        ({("t", 0): 10}, {("t", 0): 30}, {}, {}, Recount((OffsetRange("t", 0, 10, 30),))),
        # A partition that did not move has nothing to recount.
        (
            {("t", 0): 10, ("t", 1): 5},
            {("t", 0): 12, ("t", 1): 5},
            {},
            {},
            Recount((OffsetRange("t", 0, 10, 12),)),
        ),
        # A first commit with recorded starts is verifiable and exact.
        (
            None,
            {("t", 0): 8},
            {RANGE_STARTS: '{"t":{"0":3}}'},
            {},
            Recount((OffsetRange("t", 0, 3, 8),)),
        ),
        # A first commit without recorded starts: nothing can be compared.
        (None, {("t", 0): 8}, {}, {}, Recount((), exact=False, verifiable=False)),
        # Retention deleted the start: today's log start, a lower bound.
        (
            {("t", 0): 10},
            {("t", 0): 30},
            {},
            {("t", 0): 25},
            Recount((OffsetRange("t", 0, 25, 30),), exact=False),
        ),
        # A recorded lost range: the commit's range starts after it.
        (
            {("t", 0): 10},
            {("t", 0): 30},
            {LOST_RANGES: "t[0] [10, 18)"},
            {},
            Recount((OffsetRange("t", 0, 18, 30),)),
        ),
        # A lost range below the previous offsets changes nothing.
        (
            {("t", 0): 10},
            {("t", 0): 30},
            {LOST_RANGES: "t[0] [0, 4)"},
            {},
            Recount((OffsetRange("t", 0, 10, 30),)),
        ),
        # Everything lost and nothing after it: no range, still exact.
        ({("t", 0): 10}, {("t", 0): 30}, {LOST_RANGES: "t[0] [10, 30)"}, {}, Recount(())),
    ],
    ids=[
        "next",
        "unmoved",
        "first-recorded",
        "first-unrecorded",
        "retention",
        "lost",
        "lost-before",
        "all-lost",
    ],
)
def test_the_ranges_of_a_commit(
    previous: dict[tuple[str, int], int] | None,
    current: dict[tuple[str, int], int],
    properties: dict[str, str],
    log_starts: dict[tuple[str, int], int],
    expected: Recount,
) -> None:
    assert plan_recount(previous, current, properties, log_starts) == expected


def test_ranges_are_in_partition_order_whatever_the_order_of_the_offsets() -> None:
    current = {("t", 2): 4, ("a", 0): 1, ("t", 0): 3}
    recount = plan_recount({}, current, {RANGE_STARTS: '{"a":{"0":0},"t":{"0":0,"2":0}}'}, {})
    assert [(r.topic, r.partition) for r in recount.ranges] == [("a", 0), ("t", 0), ("t", 2)]
    assert recount.exact
    assert recount.verifiable
