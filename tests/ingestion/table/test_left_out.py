"""The record of what a group's reads left out on purpose (``kafka.left-out.<group>``) holds
exactly the ranges resets skipped, merges and bounds them, and excuses nothing it cannot vouch
for (pure: the commits that write it are tested on the real stack in
tests/ingestion/audit/test_coverage.py and tests/ingestion/ops/test_reset.py)."""

from __future__ import annotations

import pytest

from ingestion.table.left_out import (
    LEFT_OUT_PREFIX,
    MAX_SPANS,
    LeftOut,
    PartitionLeftOut,
    ResetNote,
    Skip,
    amend_left_out,
    read_left_out,
)
from ingestion.table.offsets import OffsetMap, TopicOffsets

KEY = ("t", 0)


def at(offset: int, topic_id: str = "id1") -> OffsetMap:
    """Offsets of t[0] only."""
    return {"t": TopicOffsets(topic_id, {0: offset})}


def note(number: int, reason: str = "why") -> ResetNote:
    return ResetNote(f"c{number}", number, 1_795_000_000_000 + number, "ops", reason)


def began_at_0() -> LeftOut:
    """The record after the partition's first commit, which read from offset 0 to 10."""
    return amend_left_out(None, 1, at(10), starts={KEY: 0})


@pytest.mark.parametrize(
    ("base", "before", "after", "fresh", "expected"),
    [
        # forward: exactly [old committed offset, new offset)
        (0, at(10), at(20), True, PartitionLeftOut("id1", 0, (Skip(10, 20, ("c2",)),))),
        # unchanged: nothing skipped
        (0, at(10), at(10), True, PartitionLeftOut("id1", 0)),
        # backward below where reading began (at 5): reading begins there now
        (5, at(10), at(4), True, PartitionLeftOut("id1", 4)),
        # the table's first commit is the reset (no offsets before): reading began there
        (None, None, at(7), True, PartitionLeftOut("id1", 7)),
        # the same where the table holds rows no proven offsets explain: nothing is claimed
        (None, None, at(7), False, None),
        # another topic under the name (recreated): its facts are dropped, reading began there
        (0, at(10), at(3, "id2"), True, PartitionLeftOut("id2", 3)),
    ],
    ids=["forward", "unchanged", "backward", "first", "unproven", "recreated"],
)
def test_a_reset_records_exactly_what_it_skips(
    base: int | None,
    before: OffsetMap | None,
    after: OffsetMap,
    fresh: bool,
    expected: PartitionLeftOut | None,
) -> None:
    """A reset from ``before`` to ``after`` on the record of a partition whose reading began
    at ``base`` (None: no record)."""
    record = None if base is None else amend_left_out(None, 1, at(10), starts={KEY: base})
    record = amend_left_out(record, 2, after, before=before, reset=note(2), fresh=fresh)
    assert record.partitions.get(KEY) == expected
    assert record.snapshot_id == 2
    assert set(record.resets) == ({"c2"} if expected and expected.skipped else set())


def test_a_commit_moving_back_cuts_what_it_reads_again() -> None:
    """Skips [10, 20) and [30, 40); a move back to 15 keeps [10, 15) only, and the reset of
    [30, 40) is no longer named."""
    record = began_at_0()
    record = amend_left_out(record, 2, at(20), before=at(10), reset=note(2))
    record = amend_left_out(record, 3, at(30))  # a run reads 20-29
    record = amend_left_out(record, 4, at(40), before=at(30), reset=note(4))
    record = amend_left_out(record, 5, at(15), before=at(40), reset=note(5))
    assert record.partitions[KEY].skipped == (Skip(10, 15, ("c2",)),)
    assert set(record.resets) == {"c2"}


def test_adjacent_resets_merge_into_one_range() -> None:
    """Ten resets of +2 with nothing read between: one range [10, 30) naming the first and
    the last reset and counting all ten."""
    record, offset = began_at_0(), 10
    for number in range(2, 12):
        record = amend_left_out(
            record, number, at(offset + 2), before=at(offset), reset=note(number)
        )
        offset += 2
    assert record.partitions[KEY].skipped == (Skip(10, 30, ("c2", "c11"), 10),)
    assert set(record.resets) == {"c2", "c11"}
    assert record.describe_skip(record.partitions[KEY].skipped[0]).startswith(
        "skipped by 10 offset resets, among them the offset reset on "
    )


def test_the_record_is_bounded() -> None:
    """A hundred forward resets of 5 offsets with 5 read between, each with a 1,000-character
    reason: the record keeps :data:`MAX_SPANS` ranges, the highest, cut below the last it
    dropped, at most two resets per range, reasons cut to 200 characters, and stays under
    40 KB."""
    record, offset = began_at_0(), 10
    for number in range(2, 102):
        reason = "x" * 1000
        record = amend_left_out(
            record, number, at(offset + 5), before=at(offset), reset=note(number, reason)
        )
        record = amend_left_out(record, number, at(offset + 10))  # a run reads 5 offsets
        offset += 10
    part = record.partitions[KEY]
    assert len(part.skipped) == MAX_SPANS
    dropped = 100 - MAX_SPANS
    assert part.skipped[0].start == 10 + 10 * dropped
    assert part.cut_below == 10 + 10 * (dropped - 1) + 5
    assert len(record.resets) == MAX_SPANS
    assert all(len(n.reason) == 200 for n in record.resets.values())
    assert len(record.encode()) < 40_000
    assert LeftOut.decode(record.encode()) == record


def test_a_reset_drops_what_retention_deleted() -> None:
    """Ranges below the log start a reset was planned against are dropped: no audit reads
    there."""
    record = amend_left_out(began_at_0(), 2, at(20), before=at(10), reset=note(2))
    record = amend_left_out(record, 3, at(30))
    record = amend_left_out(record, 4, at(40), before=at(30), reset=note(4), log_starts={KEY: 25})
    assert record.partitions[KEY].skipped == (Skip(30, 40, ("c4",)),)
    assert set(record.resets) == {"c4"}


def test_a_run_carries_the_record_and_adds_new_partitions() -> None:
    """A run's commit keeps the skipped ranges, says where a new partition's reading began,
    and drops a partition it no longer commits."""
    record = amend_left_out(began_at_0(), 2, at(20), before=at(10), reset=note(2))
    more = {"t": TopicOffsets("id1", {0: 25, 1: 3})}
    record = amend_left_out(record, 3, more, starts={("t", 1): 0})
    assert record.partitions == {
        KEY: PartitionLeftOut("id1", 0, (Skip(10, 20, ("c2",)),)),
        ("t", 1): PartitionLeftOut("id1", 0),
    }
    elsewhere = amend_left_out(record, 4, {"u": TopicOffsets("id9", {0: 1})})
    assert elsewhere.partitions == {}
    assert elsewhere.resets == {}


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "{",
        "[]",
        '{"topics": {}}',
        '{"snapshot-id": "x", "topics": {}}',
        '{"snapshot-id": 1, "topics": 3}',
        '{"snapshot-id": 1, "topics": {"t": {"id": "i", "partitions": {"0": {"skipped": [[1]]}}}}}',
    ],
)
def test_a_damaged_record_excuses_nothing(raw: str) -> None:
    """A property that is not a record (edited by hand, another tool's) is no record, and
    reading it raises nothing (a commit carrying the record would fail on it)."""
    assert read_left_out({LEFT_OUT_PREFIX + "g": raw}, "g") is None
