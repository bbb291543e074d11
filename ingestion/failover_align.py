"""Where a pipeline resumes on an MM2 replica: align the replica with what the table holds.

MM2 copies each source partition in order, keeping each record's timestamp, key, value and
headers, but not its offset. Its translations are conservative: the replica offset it gives for
the table's position can sit *before* the true one, so the first replica records from there
may be copies of records the table already holds. Resuming there would ingest them twice;
resuming further than the true position would lose records. The rule here: skip exactly the
replica records that are copies of the table's tail, verified record by record, and refuse
(never guess) when the evidence does not single out one position.

The planner (``ingestion.failover``) establishes one pair "source offset ``U`` was copied to
replica offset ``D``", from an offset sync or, with checkpoints only, from the replica's last
record before the checkpoint's offset; :func:`align_exact` then verifies the copies after it.

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
