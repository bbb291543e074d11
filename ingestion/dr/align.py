"""Where a pipeline resumes on an MM2 replica: align the replica with what the table holds.

MM2 copies each source partition in order, keeping each record's timestamp, key, value and
headers, but not its offset. Its translations are conservative: the replica offset it gives for
the table's position can sit *before* the true one, so the first replica records from there
may be copies of records the table already holds. Resuming there would ingest them twice;
resuming further than the true position would lose records. The rule here: skip exactly the
replica records that are copies of the table's tail, verified record by record, and refuse
(never guess) when the evidence does not single out one position.

The planner (``ingestion.dr.failover``) establishes one pair "source offset ``U`` was copied to
replica offset ``D``", from an offset sync or, with checkpoints only, from the replica's last
record before the checkpoint's offset; :func:`align_exact` then verifies the copies after it.

Records are compared by identity: Kafka timestamp and key bytes, and a digest of the value and
headers (:func:`digest_record`) when both sides are Kafka records (MM2 copies both byte for byte;
the table's rows are decoded and carry none). Pure functions, no I/O.

A failback places the origin's unreplicated tail with :func:`split_tail` (the other direction:
which origin records have a copy on the replica; ``ingestion.dr.failback.origin``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from ingestion.exceptions import FailoverRefusedError, ReplicaBehindError


@dataclass(frozen=True)
class RecordId:
    """What identifies one record across clusters: MM2 keeps timestamp and key."""

    timestamp_ms: int
    key: bytes | None
    value_digest: bytes | None = None

    def matches(self, other: RecordId) -> bool:
        """Same timestamp and key; same value digest when both carry one."""
        if (self.timestamp_ms, self.key) != (other.timestamp_ms, other.key):
            return False
        if self.value_digest is None or other.value_digest is None:
            return True
        return self.value_digest == other.value_digest


def digest_record(value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None) -> bytes:
    """A digest of a record's value and headers (each length-prefixed: unambiguous).

    Example:
        >>> digest_record(b"v", None) == digest_record(b"v", [])
        True
        >>> digest_record(b"v", [("h", b"1")]) == digest_record(b"v", [("h", b"2")])
        False
    """
    digest = hashlib.blake2b(digest_size=16)

    def feed(part: bytes | None) -> None:
        digest.update(b"\xff" * 8 if part is None else len(part).to_bytes(8, "big") + part)

    feed(value)
    for name, header in headers or []:
        feed(name.encode())
        feed(header)
    return digest.digest()


def key_digest(key: bytes | None) -> str | None:
    """A short digest of a record key (None for a null key).

    Example:
        >>> key_digest(b"k1") == key_digest(b"k1"), key_digest(None)
        (True, None)
    """
    return None if key is None else hashlib.blake2b(key, digest_size=8).hexdigest()


def uncopied_records(
    tail: Sequence[tuple[int, RecordId]],
) -> tuple[tuple[int, int, str | None], ...]:
    """The plan's form of the table's uncopied records (source offset, timestamp, key digest)."""
    return tuple((offset, r.timestamp_ms, key_digest(r.key)) for offset, r in tail)


def is_strong(mine: RecordId, theirs: RecordId) -> bool:
    """Both sides carry a value digest (both are Kafka records): a match is byte for byte."""
    return mine.value_digest is not None and theirs.value_digest is not None


@dataclass(frozen=True)
class Alignment:
    """Resume the replica partition at ``start``, after ``skipped`` copies of ingested records;
    ``uncopied`` records the table ingested have no copy there (MM2 was behind the table when
    the source went down: :func:`align_exact`)."""

    start: int
    skipped: int
    uncopied: int = 0
    # The uncopied records as (source offset, timestamp, key digest): ingestion.dr.late_copies.guard
    uncopied_records: tuple[tuple[int, int, str | None], ...] = field(default=(), repr=False)


def _start_after(
    replica: Sequence[tuple[int, RecordId]], k: int, replica_end: int, where: str
) -> int:
    if k < len(replica):
        return replica[k][0]
    if k == len(replica):
        return replica_end  # every replica record so far is ingested: resume at its end
    raise ReplicaBehindError(
        f"{where}: the replica holds {len(replica)} record(s) after the anchor but the table "
        f"already ingested {k} from the source: the replica is behind the table. Wait for "
        "MirrorMaker 2 to catch up (or fail over later); nothing was changed."
    )


def align_exact(
    tail: Sequence[RecordId],
    replica: Sequence[tuple[int, RecordId]],
    replica_end: int,
    where: str,
    source_down: bool = False,
) -> Alignment:
    """Align after an exact anchor: ``tail`` is every record the table holds after the anchor's
    source offset (in offset order), ``replica`` the records after the anchor's replica offset
    (offset, identity), read until ``len(tail) + 1`` records or ``replica_end`` (to
    ``replica_end`` with ``source_down``).

    The replica's records after the anchor are copies of the tail, in order, then records MM2
    had not copied (or producers wrote on the replica). With the source up, a table ahead of
    the replica is refused: MM2 will copy the rest, and reading past it would read those copies
    later. With ``source_down`` (the disaster: nothing more will be copied while it is down) the
    replica may stop short of the tail: the copies are the longest prefix of the tail matching
    the replica, and the rest of the tail is *uncopied* (ingested from the source, no copy).
    Refused even then when a record of that rest has a copy further on: the replica is not MM2's
    in-order copy, and a resume there would read it twice.

    Example:
        >>> ids = [RecordId(t, b"k") for t in (1, 2, 3, 9)]
        >>> align_exact(ids[:2], [(11, ids[0]), (12, ids[1]), (13, ids[2])], 14, "p")
        Alignment(start=13, skipped=2, uncopied=0)
        >>> align_exact(ids[:3], [(11, ids[0]), (12, ids[3])], 13, "p", source_down=True)
        Alignment(start=12, skipped=1, uncopied=2)
    """
    k = 0
    while k < min(len(tail), len(replica)) and tail[k].matches(replica[k][1]):
        k += 1
    if k == len(tail) or not source_down:
        if k < len(tail) and k < len(replica):
            offset, theirs = replica[k]
            raise ReplicaBehindError(
                f"{where}: replica offset {offset} should be a copy of the table's record "
                f"{k + 1} of {len(tail)} after the anchor, but differs ({tail[k]} vs {theirs}). "
                "The replica is not a copy of what the table ingested (another topic, a reset "
                "in between, or a replication policy that filters), or MirrorMaker 2 is behind "
                "the table: wait for it to catch up; nothing was changed."
            )
        return Alignment(_start_after(replica, len(tail), replica_end, where), len(tail))
    later = {(r.timestamp_ms, r.key): offset for offset, r in replica[k:]}
    for position, mine in enumerate(tail[k:], start=k):
        found = later.get((mine.timestamp_ms, mine.key))
        if found is not None:
            raise FailoverRefusedError(
                f"{where}: the table's record {position + 1} of {len(tail)} after the anchor "
                f"({mine}) has a copy at replica offset {found}, after records that are no "
                "copies: producers wrote on the replica while MirrorMaker 2 was still copying "
                "(or the replica is not MM2's in-order copy of the topic). One resume offset "
                "cannot skip copies that follow other records, and the platform does not keep "
                "skip lists; nothing was changed. Inspect the replica partition from the "
                "anchor: the copies after the first non-copy would be read twice"
            )
    start = replica[k][0] if k < len(replica) else replica_end
    return Alignment(start, k, len(tail) - k)


Records = Sequence[tuple[int, RecordId]]
UNCHANGED = "Nothing was changed; the pipeline keeps reading the replica"


def _embed(origin: Records, copies: Records, first: int) -> list[int]:
    """Positions in ``copies`` (from ``first``, earliest first) of the longest prefix of
    ``origin`` that appears there in order."""
    positions, at = [], first
    for _, record in origin:
        while at < len(copies) and not record.matches(copies[at][1]):
            at += 1
        if at == len(copies):
            break
        positions.append(at)
        at += 1
    return positions


def _pin(origin: Records, copies: Records, anchor: tuple[int, int], where: str) -> list[int]:
    """Positions in ``copies`` of the origin records up to the anchor's ``U`` (MM2's offset
    sync ``U -> D``: origin ``U`` was copied to replica ``D``, and MM2 copies in order)."""
    upstream, downstream = anchor
    sync = f"MM2's offset sync {upstream} -> {downstream} (the origin's record {upstream} copied"
    index = next((i for i, (offset, _) in enumerate(origin) if offset == upstream), None)
    at = next((j for j, (offset, _) in enumerate(copies) if offset == downstream), None)
    if index is None or at is None:
        missing = "the origin" if index is None else "the replica copy since the failover"
        raise FailoverRefusedError(
            f"{where}: {sync} to replica offset {downstream}) names a record {missing} does not "
            f"hold (recreated or truncated since, or a stale sync). {UNCHANGED}. Inspect the "
            "offset-syncs topic on the primary and both partitions at these offsets"
        )
    before = _embed(origin[:index], copies[:at], 0)
    if not origin[index][1].matches(copies[at][1]) or len(before) < index:
        raise FailoverRefusedError(
            f"{where}: {sync} to replica offset {downstream}), but the replica does not hold "
            f"copies of origin offsets {origin[0][0]}..{upstream} in order up to there: it is not "
            f"a copy of this topic, or was rewritten. {UNCHANGED}. Inspect both partitions"
        )
    return [*before, at]


def _refuse_guesses(
    rest: Records, copies: Records, found: list[int], first: int, where: str
) -> None:
    """Refuse when a match the skip relies on is a guess: after the last byte-for-byte match
    (which proves every origin record before it copied, as MM2 copies in order), a match by
    timestamp and key alone (a table row: retention deleted the replica's record) whose identity
    another replica or origin record shares."""
    strong = [i for i, at in enumerate(found) if is_strong(rest[i][1], copies[at][1])]
    proven = strong[-1] + 1 if strong else 0
    if proven == len(found):
        return
    low = found[proven - 1] + 1 if proven else first
    replica, origin = by_identity(copies[low:]), by_identity(rest[proven:])
    for i in range(proven, len(found)):
        (offset, mine), (copy, theirs) = rest[i], copies[found[i]]
        same = (mine.timestamp_ms, mine.key)
        rivals = [o for o, r in replica.get(same, []) if mine.matches(r)]
        twins = [o for o, r in origin.get(same, []) if r.matches(theirs)]
        if len(rivals) > 1 or len(twins) > 1:
            raise FailoverRefusedError(
                f"{where}: origin offset {offset} matches replica offset {copy} by Kafka timestamp "
                f"and key only (retention deleted the replica's record; the table's row has no "
                f"value to compare), and that identity repeats (replica offsets {rivals[:5]}, "
                f"origin offsets {twins[:5]}): whether it is the copy or another producer's "
                f"record cannot be told, and a wrong skip loses the record. {UNCHANGED}. Inspect "
                "both partitions from these offsets; with the replica's target_alias set, MM2's "
                "offset syncs on the primary anchor the copies"
            )


def by_identity(records: Records) -> dict[tuple[int, bytes | None], list[tuple[int, RecordId]]]:
    """``records`` grouped by (timestamp, key), each group in the given order."""
    found: dict[tuple[int, bytes | None], list[tuple[int, RecordId]]] = {}
    for offset, record in records:
        found.setdefault((record.timestamp_ms, record.key), []).append((offset, record))
    return found


def _refuse_out_of_order(
    origin: Records, copies: Records, count: int, last: int, where: str
) -> None:
    """Refuse when an origin record after the first uncopied one (``origin[count]``) has a copy
    after the last matched position ``last``: MM2 copies in order."""
    later = by_identity(copies[last + 1 :])
    for offset, record in origin[count + 1 :]:
        same = later.get((record.timestamp_ms, record.key), [])
        found = next((o for o, r in same if record.matches(r)), None)
        if found is not None:
            raise FailoverRefusedError(
                f"{where}: origin offset {offset} has a copy on the replica (offset {found}) "
                f"although origin offset {origin[count][0]} before it has none: the copies are "
                "not in the origin's order (a producer re-sent the record to the replica, or "
                "the replica is not a copy of this topic), so the unreplicated tail cannot be "
                f"told apart. {UNCHANGED}. Inspect both partitions from these offsets."
            )


def split_tail(
    origin: Records,
    copies: Records,
    origin_end: int,
    where: str,
    anchor: tuple[int, int] | None = None,
) -> tuple[int, list[int]]:
    """The origin offset where a failback's unreplicated tail starts, and the replica offsets
    of the copies of the origin records before it.

    ``origin`` is the origin partition's records from the pre-failover position (with value
    digests), ``copies`` the replica partition from the failover's start, both in offset order:
    records still in Kafka carry a digest, the table's rows (retention deleted the replica's
    record) do not. The copied records are a prefix of ``origin``, their copies in ``copies`` in
    the same order among the replica producers' records. ``anchor`` (MM2's forward offset sync
    ``U -> D``) pins the prefix up to ``U``; after it, a byte-for-byte match proves every
    record before it copied. A match by timestamp and key alone whose identity repeats is a
    guess: refused, never skipped; so is a copy after the first uncopied record.

    Example:
        >>> ids = [RecordId(1, None, bytes([n])) for n in range(4)]  # keyless, one millisecond
        >>> split_tail([(5, ids[0]), (6, ids[1]), (7, ids[2])], [(40, ids[0]), (41, ids[3]),
        ...     (42, ids[1])], 8, "p")
        (7, [40, 42])
    """
    pinned = _pin(origin, copies, anchor, where) if anchor is not None else []
    first = pinned[-1] + 1 if pinned else 0
    rest = origin[len(pinned) :]
    found = _embed(rest, copies, first)
    _refuse_guesses(rest, copies, found, first, where)
    positions = pinned + found
    _refuse_out_of_order(origin, copies, len(positions), positions[-1] if positions else -1, where)
    resume = origin[len(positions)][0] if len(positions) < len(origin) else origin_end
    return resume, [copies[at][0] for at in positions]
