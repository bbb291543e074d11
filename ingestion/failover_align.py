"""Where a pipeline resumes on an MM2 replica: align the replica with what the table holds.

MM2 copies each source partition in order, keeping each record's timestamp, key, value and
headers, but not its offset. Its translations are conservative: the replica offset it gives for
the table's position can sit *before* the true one, so the first replica records from there
may be copies of records the table already holds. Resuming there would ingest them twice;
resuming further than the true position would lose records. The rule here: skip exactly the
replica records that are copies of the table's tail, verified record by record, and refuse
(never guess) when the evidence does not single out one position.

Two cases:

- **Exact anchor** (an offset sync ``U -> D``, with ``U`` at or before the table's position):
  replica offset ``D`` holds source record ``U``, so the replica records after ``D`` are the
  source records after ``U`` in order. The table's records after ``U`` (data plus quarantine)
  must match the first replica records one for one; resume after them.
- **Checkpoint only** (``U -> D``, ``D`` conservative): the number of replica records before the
  true position is unknown. The scan starts one record before ``D``: that record is a copy of an
  ingested one whichever way MM2 translated (``D - 1`` holds either the sync's source record,
  or the record just before ``U``), so at least one copy, plus the table's records from ``U``
  on, precede the true position. Every count ``k`` at or above that bound for which the first
  ``k`` replica records equal the table's last ``k`` is a candidate; exactly one must remain,
  or the failover is refused with what was seen. (Without the bound, "no copies" would always
  be a candidate and a coincidence could not be told from a copy.)

Records are compared by identity: Kafka timestamp and key bytes (and a value digest when both
sides have one). Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ingestion.exceptions import FailoverRefusedError


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


@dataclass(frozen=True)
class Alignment:
    """Resume the replica partition at ``start``, after ``skipped`` copies of ingested records."""

    start: int
    skipped: int


def _prefix_matches(tail: Sequence[RecordId], replica: Sequence[RecordId], k: int) -> bool:
    """The first ``k`` replica records are the last ``k`` of the table's tail, in order."""
    if k > len(tail) or k > len(replica):
        return False
    return all(t.matches(r) for t, r in zip(tail[len(tail) - k :], replica[:k], strict=True))


def _inside(tail: Sequence[RecordId], replica: Sequence[RecordId]) -> bool:
    """All of ``replica`` (non-empty) is a run of ``tail`` that ends before the tail does."""
    size = len(replica)
    return size > 0 and any(
        all(t.matches(r) for t, r in zip(tail[i : i + size], replica, strict=True))
        for i in range(len(tail) - size)
    )


def _start_after(
    replica: Sequence[tuple[int, RecordId]], k: int, replica_end: int, where: str
) -> int:
    if k < len(replica):
        return replica[k][0]
    if k == len(replica):
        return replica_end  # every replica record so far is ingested: resume at its end
    raise FailoverRefusedError(
        f"{where}: the replica holds {len(replica)} record(s) after the anchor but the table "
        f"already ingested {k} from the source: the replica is behind the table. Wait for "
        "MirrorMaker 2 to catch up (or fail over later); nothing was changed."
    )


def align_exact(
    tail: Sequence[RecordId],
    replica: Sequence[tuple[int, RecordId]],
    replica_end: int,
    where: str,
) -> Alignment:
    """Align after an exact anchor: ``tail`` is every record the table holds after the anchor's
    source offset (in offset order), ``replica`` the records after the anchor's replica offset
    (offset, identity), read until ``len(tail) + 1`` records or ``replica_end``.

    Example:
        >>> ids = [RecordId(t, b"k") for t in (1, 2, 3)]
        >>> align_exact(ids[:2], [(11, ids[0]), (12, ids[1]), (13, ids[2])], 14, "p")
        Alignment(start=13, skipped=2)
    """
    skipped = len(tail)
    start = _start_after(replica, skipped, replica_end, where)
    for position, (mine, (offset, theirs)) in enumerate(zip(tail, replica, strict=False)):
        if not mine.matches(theirs):
            raise FailoverRefusedError(
                f"{where}: replica offset {offset} should be a copy of the table's record "
                f"{position + 1} of {skipped} after the anchor, but differs ({mine} vs {theirs}). "
                "The replica is not a copy of what the table ingested (another topic, a reset "
                "in between, or a replication policy that filters); nothing was changed."
            )
    return Alignment(start, skipped)


def align_by_content(
    tail: Sequence[RecordId],
    replica: Sequence[tuple[int, RecordId]],
    replica_end: int,
    min_skip: int,
    tail_is_complete: bool,
    where: str,
) -> Alignment:
    """Align from a conservative translation by matching the table's tail record by record.

    ``tail`` is the table's last records of the partition (in offset order), ``replica`` the
    replica's records from the translated offset (read to ``len(tail) + 1`` records or its end),
    ``min_skip`` (at least 1) how many of them are certainly ingested: one for the record
    before the translated offset, plus the table's records at or after the checkpoint's source
    offset. ``tail_is_complete`` says the tail goes back to the
    partition's first ingested record, so a full-length match is not a too-short window.

    Example:
        >>> ids = [RecordId(t, None) for t in (5, 6, 7, 8)]
        >>> replica = [(20, ids[1]), (21, ids[2]), (22, ids[3])]
        >>> align_by_content(ids[:3], replica, 23, 1, False, "p")
        Alignment(start=22, skipped=2)
    """
    if min_skip < 1:
        raise ValueError("scan from one record before the translated offset: min_skip >= 1")
    limit = min(len(tail), len(replica))
    copies = [record for _, record in replica]
    candidates = [k for k in range(min_skip, limit + 1) if _prefix_matches(tail, copies, k)]
    if min_skip > len(replica):
        _start_after(replica, min_skip, replica_end, where)  # raises: the replica is behind
    if not candidates and _inside(tail, copies):
        raise FailoverRefusedError(
            f"{where}: the replica's newest records are copies of records the table ingested "
            "earlier, not of its last ones: the replica is behind the table. Wait for "
            "MirrorMaker 2 to catch up (or fail over later); nothing was changed."
        )
    if not candidates:
        raise FailoverRefusedError(
            f"{where}: no position on the replica continues the table's records (checked "
            f"{len(replica)} replica record(s) against the table's last {len(tail)}); the "
            "replica is not a copy of what the table ingested. Nothing was changed."
        )
    if len(candidates) > 1:
        offsets = [replica[k][0] if k < len(replica) else replica_end for k in candidates]
        raise FailoverRefusedError(
            f"{where}: {len(candidates)} replica positions continue the table's records "
            f"equally well (offsets {offsets}): records repeat with the same timestamp and "
            "key. Fail over from an offset sync (exact) or pass the replica offsets "
            "explicitly; nothing was changed."
        )
    (skipped,) = candidates
    if skipped == len(tail) and not tail_is_complete:
        raise FailoverRefusedError(
            f"{where}: all {skipped} compared records match, so the copies may reach further "
            "back than the table's tail that was read. Retry with a larger window; nothing "
            "was changed."
        )
    return Alignment(_start_after(replica, skipped, replica_end, where), skipped)
