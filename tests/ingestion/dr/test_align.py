"""Where a failback's unreplicated tail starts (``split_tail``): pure, no I/O.

Origin records sit at offsets 10.., the replica copy from the failover's start at 100...
``kafka`` records carry a digest of the value (both sides are Kafka records); ``row`` records are
the table's rows (retention deleted the replica's record: timestamp and key only). The replica
producers' records (``x``, ``y``) share the tail's millisecond and key on purpose.
"""

from __future__ import annotations

import pytest

from ingestion.dr.align import RecordId, digest_record, split_tail
from ingestion.exceptions import FailoverRefusedError


def kafka(value: str, key: bytes | None = None, stamp: int = 1) -> RecordId:
    """A Kafka record (origin, or still on the replica): timestamp, key and value digest."""
    return RecordId(stamp, key, digest_record(value.encode(), None))


def row(key: bytes | None = None, stamp: int = 1) -> RecordId:
    """A table row for a replica record retention deleted: timestamp and key only."""
    return RecordId(stamp, key)


def at(first: int, records: list[RecordId]) -> list[tuple[int, RecordId]]:
    return [(first + n, record) for n, record in enumerate(records)]


BURST = [kafka(v) for v in "abcde"]  # keyless, one millisecond
K1, K2 = kafka("v1", b"k", 5), kafka("v2", b"k", 6)

PLACED = [
    # (origin, replica, anchor, resume, copies): the old (timestamp, key) greedy match took x
    # and y, same millisecond and no key, for copies of c and d and skipped them (lost).
    pytest.param(
        BURST,
        [*BURST[:2], kafka("x"), kafka("y")],
        None,
        12,
        [100, 101],
        id="keyless-burst-producer-records-after-the-copies",
    ),
    pytest.param(
        BURST,
        [BURST[0], kafka("x"), BURST[1]],
        None,
        12,
        [100, 102],
        id="keyless-burst-producer-record-between-the-copies",
    ),
    # Before: refused ("a later record has a copy") although only a and b were copied.
    pytest.param(BURST[:3], BURST[:2], None, 12, [100, 101], id="keyless-burst-prefix-copied"),
    # A replica producer's record with the tail record's timestamp and key, another value.
    pytest.param(
        [K1, K2],
        [K1, kafka("other", b"k", 6)],
        None,
        11,
        [100],
        id="same-timestamp-and-key-as-a-tail-record",
    ),
    pytest.param(
        [K1, K2],
        [kafka("other", b"k", 5)],
        None,
        10,
        [],
        id="same-timestamp-and-key-as-the-first-tail-record",
    ),
    # Rows with repeated identities, but MM2's offset sync 11 -> 101 pins a and b as copied.
    pytest.param(
        BURST[:3],
        [row(), row(), kafka("x")],
        (11, 101),
        12,
        [100, 101],
        id="keyless-rows-pinned-by-an-offset-sync",
    ),
    # The byte-for-byte copy of c proves a and b copied (MM2 copies in order).
    pytest.param(
        BURST[:3],
        [row(), row(), BURST[2]],
        None,
        13,
        [100, 101, 102],
        id="keyless-rows-before-a-byte-for-byte-copy",
    ),
    pytest.param(
        [K1, K2],
        [row(b"k", 5), kafka("x", b"z", 7)],
        None,
        11,
        [100],
        id="keyed-row-unique-identity",
    ),
    pytest.param(BURST[:2], [], None, 10, [], id="nothing-copied"),
    pytest.param(
        BURST[:4], BURST[:4], (13, 103), 14, [100, 101, 102, 103], id="all-copied-sync-on-the-last"
    ),
]


@pytest.mark.parametrize(("origin", "replica", "anchor", "resume", "copies"), PLACED)
def test_the_tail_starts_at_the_first_record_without_a_copy(
    origin: list[RecordId],
    replica: list[RecordId],
    anchor: tuple[int, int] | None,
    resume: int,
    copies: list[int],
) -> None:
    end = 10 + len(origin)
    assert split_tail(at(10, origin), at(100, replica), end, "p", anchor) == (resume, copies)


REFUSED = [
    # Two rows of the burst's identity: copies of a and b, or producers' records?
    pytest.param(
        BURST[:3],
        [row(), row()],
        None,
        "origin offset 10 matches replica offset 100 by Kafka timestamp and key only",
        id="keyless-rows-without-an-anchor",
    ),
    # The sync pins a; b's row could be c's producer twin.
    pytest.param(
        BURST[:3],
        [row(), row()],
        (10, 100),
        "origin offset 11 matches replica offset 101 by Kafka timestamp and key only",
        id="keyless-rows-after-the-anchor",
    ),
    # k22 re-sent to the replica (byte for byte), k20 never copied.
    pytest.param(
        [K1, K2],
        [K2],
        None,
        "origin offset 11 has a copy on the replica (offset 100) "
        "although origin offset 10 before it has none",
        id="copy-out-of-order",
    ),
    pytest.param(
        [K1, K2],
        [kafka("x", b"k", 5), K2],
        (10, 100),
        "MM2's offset sync 10 -> 100",
        id="sync-not-borne-out-by-the-records",
    ),
    pytest.param(
        [K1, K2],
        [K1],
        (11, 105),
        "names a record the replica copy since the failover does not hold",
        id="sync-beyond-the-replica",
    ),
]


@pytest.mark.parametrize(("origin", "replica", "anchor", "message"), REFUSED)
def test_a_skip_that_would_be_a_guess_is_refused(
    origin: list[RecordId],
    replica: list[RecordId],
    anchor: tuple[int, int] | None,
    message: str,
) -> None:
    where = "pipeline 'p': failback of origin t[0] (offset 10)"
    with pytest.raises(FailoverRefusedError) as refused:
        split_tail(at(10, origin), at(100, replica), 10 + len(origin), where, anchor)
    text = str(refused.value)
    assert text.startswith(where), text
    assert message in text, text
    assert "Nothing was changed" in text, text


def test_the_digest_covers_value_and_headers() -> None:
    plain = digest_record(b"v", None)
    assert digest_record(b"v", [("h", b"1")]) != plain
    assert digest_record(b"v", [("h", None)]) != digest_record(b"v", [("h", b"")])
    assert digest_record(None, None) != digest_record(b"", None)
    assert kafka("a").matches(row())
    assert not kafka("a").matches(kafka("b"))
