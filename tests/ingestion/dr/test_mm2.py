"""MirrorMaker 2 wire format and offset translation, and failover alignment (pure functions)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ingestion.dr.align import RecordId, align_exact
from ingestion.dr.failback.flow_loop import LoopedRecord
from ingestion.dr.mm2 import (
    Checkpoint,
    OffsetSync,
    checkpoints_topic,
    decode_checkpoint,
    decode_offset_sync,
    encode_checkpoint,
    encode_offset_sync,
    offset_syncs_topic,
    replica_topic,
    translate_downstream,
)
from ingestion.dr.replica_check import ReplicaFacts, check_replica
from ingestion.exceptions import FailoverRefusedError, ReplicaFormatError

# A checkpoint record written out by hand from Kafka's format definition (Checkpoint.java:
# KEY_SCHEMA = group STRING, topic STRING, partition INT32; HEADER_SCHEMA = version INT16;
# VALUE_SCHEMA_V0 = upstreamOffset INT64, offset INT64, metadata STRING; STRING = INT16 length
# then UTF-8; all big-endian), not produced by the encoder under test.
CHECKPOINT_KEY = bytes.fromhex("0002" + b"g1".hex() + "000e" + b"primary.orders".hex() + "00000002")
CHECKPOINT_VALUE = bytes.fromhex(
    "0000" + "000000000000002a" + "0000000000000028" + "0004" + b"meta".hex()
)
# OffsetSync.java: KEY_SCHEMA = topic STRING, partition INT32; VALUE_SCHEMA = upstreamOffset
# INT64, offset INT64 (no version header).
SYNC_KEY = bytes.fromhex("0006" + b"orders".hex() + "00000003")
SYNC_VALUE = bytes.fromhex("00000000000f4240" + "0000000000000007")


def test_a_checkpoint_record_decodes_byte_for_byte() -> None:
    checkpoint = decode_checkpoint(CHECKPOINT_KEY, CHECKPOINT_VALUE)
    assert checkpoint == Checkpoint("g1", "primary.orders", 2, 42, 40, "meta")
    assert encode_checkpoint(checkpoint) == (CHECKPOINT_KEY, CHECKPOINT_VALUE)


def test_an_offset_sync_record_decodes_byte_for_byte() -> None:
    sync = decode_offset_sync(SYNC_KEY, SYNC_VALUE)
    assert sync == OffsetSync("orders", 3, 1_000_000, 7)
    assert encode_offset_sync(sync) == (SYNC_KEY, SYNC_VALUE)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (CHECKPOINT_KEY[:-1], CHECKPOINT_VALUE, "checkpoint key: truncated"),
        (CHECKPOINT_KEY, CHECKPOINT_VALUE[:10], "checkpoint value: truncated"),
        (CHECKPOINT_KEY, b"\x00\x01" + CHECKPOINT_VALUE[2:], "version 1"),
        (b"\x00\x09ab", CHECKPOINT_VALUE, "bad string length 9"),
    ],
)
def test_records_that_are_not_checkpoints_are_refused(
    key: bytes, value: bytes, message: str
) -> None:
    with pytest.raises(ReplicaFormatError, match=message):
        decode_checkpoint(key, value)


def test_topic_names_follow_mm2() -> None:
    assert replica_topic("orders", "primary") == "primary.orders"
    assert replica_topic("orders", "primary", "identity") == "orders"
    assert checkpoints_topic("primary") == "primary.checkpoints.internal"
    assert offset_syncs_topic("backup") == "mm2-offset-syncs.backup.internal"


SYNCS = [OffsetSync("t", 0, 10, 100), OffsetSync("t", 0, 40, 130), OffsetSync("t", 0, 90, 175)]


@pytest.mark.parametrize(
    ("upstream", "downstream"),
    [(5, None), (10, 100), (11, 101), (39, 101), (40, 130), (89, 131), (90, 175), (500, 176)],
)
def test_translation_is_mm2s_conservative_one(upstream: int, downstream: int | None) -> None:
    assert translate_downstream(SYNCS, upstream) == downstream


def ids(*stamps: int, key: bytes | None = b"k") -> list[RecordId]:
    return [RecordId(stamp, key) for stamp in stamps]


def replica(first_offset: int, records: list[RecordId]) -> list[tuple[int, RecordId]]:
    return [(first_offset + i, r) for i, r in enumerate(records)]


def test_exact_anchor_skips_the_ingested_copies() -> None:
    aligned = align_exact(ids(2, 3), replica(51, ids(2, 3, 4)), 54, "orders[0]")
    assert (aligned.start, aligned.skipped) == (53, 2)


def test_exact_anchor_at_the_replica_end_resumes_there() -> None:
    assert align_exact(ids(2, 3), replica(51, ids(2, 3)), 53, "p").start == 53


def test_exact_anchor_with_the_replica_behind_is_refused() -> None:
    with pytest.raises(FailoverRefusedError, match="the replica is behind the table"):
        align_exact(ids(2, 3, 4), replica(51, ids(2, 3)), 53, "orders[0]")


def test_exact_anchor_with_a_different_record_is_refused() -> None:
    with pytest.raises(FailoverRefusedError, match="replica offset 52 should be a copy"):
        align_exact(ids(2, 3), replica(51, ids(2, 9, 4)), 54, "orders[0]")


@pytest.mark.parametrize(
    ("tail", "copies", "end", "expected"),
    [
        # MM2 had copied 2 of 4 ingested records when the source went down; the replica's
        # producers wrote 90, 91 since: resume at 90, two ingested records have no copy.
        (ids(2, 3, 4, 5), replica(51, ids(2, 3, 90, 91)), 55, (53, 2, 2)),
        (ids(2, 3, 4), replica(51, ids(2)), 52, (52, 1, 2)),  # nothing after the copies yet
        (ids(2, 3), replica(51, ids(2, 3, 90)), 54, (53, 2, 0)),  # the usual case, unchanged
        (ids(2, 3), [], 51, (51, 0, 2)),  # nothing copied after the anchor
    ],
)
def test_with_the_source_down_a_table_ahead_of_the_replica_fails_over(
    tail: list[RecordId], copies: list[tuple[int, RecordId]], end: int, expected: tuple[int, ...]
) -> None:
    aligned = align_exact(tail, copies, end, "orders[0]", source_down=True)
    assert (aligned.start, aligned.skipped, aligned.uncopied) == expected


def test_with_the_source_down_a_copy_after_non_copies_is_refused() -> None:
    # Record 4 has a copy, but after a record that is none: not MM2's in-order copy.
    with pytest.raises(FailoverRefusedError, match="has a copy at replica offset 54"):
        align_exact(ids(2, 3, 4), replica(51, ids(2, 90, 91, 4)), 55, "o[0]", source_down=True)


def test_with_the_source_up_a_table_ahead_of_the_replica_waits_for_mm2() -> None:
    with pytest.raises(FailoverRefusedError, match="MirrorMaker 2 is behind the table: wait"):
        align_exact(ids(2, 3, 4), replica(51, ids(2, 90)), 53, "orders[0]")


def test_value_digests_break_ties_when_both_sides_have_them() -> None:
    assert RecordId(1, b"k", b"a").matches(RecordId(1, b"k", None))
    assert not RecordId(1, b"k", b"a").matches(RecordId(1, b"k", b"b"))


READY = ReplicaFacts("dr", "primary", "g", 1, "compact", True, 20.0, {"o": (3, "primary.o", 3)})


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        ({"checkpoint_partitions": None}, "does not exist on the replica"),
        ({"checkpoint_partitions": 3}, "has 3 partitions; MM2 needs exactly 1"),
        ({"checkpoint_cleanup_policy": "delete"}, "set cleanup.policy=compact"),
        (
            {"group_has_source_offsets": False, "newest_checkpoint_age_s": None},
            "no committed offsets on the source cluster, so MM2's checkpoint connector finds "
            "no group",
        ),
        ({"newest_checkpoint_age_s": None}, "no checkpoint for group 'g'"),
        ({"newest_checkpoint_age_s": 900.0}, "older than 300 s"),
        ({"topics": {"o": (3, "primary.o", None)}}, "has no copy 'primary.o'"),
        ({"topics": {"o": (3, "primary.o", 2)}}, "has 2 partitions, source 'o' has 3"),
        ({"timestamp_types": {"primary.o": "LogAppendTime"}}, "set it to CreateTime"),
        ({"unread_local": {"o": 4}}, "Point producers that fail over at the copy"),
        (
            {"looped": [LoopedRecord("dr.o", 1, 77, "o", 55)]},
            "records of 'o' come back through 'dr.o': MirrorMaker 2's forward and reverse flows",
        ),
    ],
)
def test_each_replica_problem_fails_the_check_with_its_fix(
    change: dict[str, object], fix: str
) -> None:
    assert check_replica(READY, 300).passed
    finding = check_replica(replace(READY, **change), 300)  # type: ignore[arg-type]
    assert finding.blocks
    assert fix in finding.message


def test_a_stale_checkpoint_keeps_one_fingerprint_as_it_ages() -> None:
    older = [replace(READY, newest_checkpoint_age_s=age) for age in (400.0, 4000.0)]
    assert len({check_replica(f, 300).fingerprint for f in older}) == 1
