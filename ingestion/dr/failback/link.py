"""Failback of a replica partition anchored before the failover: align through the origin.

A failback aligns the primary's reverse copy with what the table ingested from the replica
topic (``ingestion.dr.failover``). MM2's anchor for it (an offset sync, or the record before a
checkpoint's offset) is often a copy of a replica record *before* the failover's start ``D``:
offset syncs are sparse (``offset.lag.max``), and a partition that got nothing on the replica
since the failover has no other. The table holds those records, but under the origin topic's
name and offsets (read on the primary before the failover), so looking them up under the
replica topic finds nothing and the failback would be refused.

The replica records before ``D`` are copies, in order, of the origin's records before the
pre-failover position ``N`` (the failover verified that), less the last ones a ``--source-lost``
failover found uncopied (R54: the replica never got them). So from an anchor record ``A`` on the
reverse copy: find ``A``'s identity (Kafka timestamp and key) among the origin's rows below
``N``; the table's records after it, as the replica partition saw them, are the origin's rows
after that one up to ``N`` followed by the rows read from the replica from ``D``; the reverse
copy's records after ``A`` must be their copies one for one
(:func:`~ingestion.dr.align.align_exact`). Refused, never guessed, when no origin row or
more than one continue like the reverse copy. Reads only.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingestion.dr.align import Alignment, RecordId, align_exact, uncopied_records
from ingestion.dr.failover import locate
from ingestion.dr.replica_reader import Replica
from ingestion.dr.rows import Records, ingested_tail
from ingestion.exceptions import FailoverRefusedError
from ingestion.kafka.ranges import Key

if TYPE_CHECKING:
    from pyiceberg.table import Table


@dataclass(frozen=True)
class OriginLink:
    """Replica partition ``key`` (read from ``replica_start``, up to ``source_next`` now) was
    the copy of ``origin``, read on the primary up to ``committed_before`` before the failover;
    ``reverse_topic`` is the primary's reverse copy of it."""

    key: Key
    source_next: int
    reverse_topic: str
    origin: Key
    committed_before: int
    replica_start: int
    pipeline: str = ""
    # The clusters the origin's and the replica's rows were read on, when a replica topic has
    # its origin's name and the rows tell them apart (ingestion.dr.cluster_rows); else None.
    origin_cluster: str | None = None
    replica_cluster: str | None = None
    # The replica is lost (--source-lost): the reverse copy may end before the table's position
    # (align_exact's source_down); the records read on the replica beyond it are uncopied.
    source_down: bool = False
    # The failover's uncopied records of this partition (a --source-lost failover, R54): the
    # last ones the table read on the origin before ``committed_before``, with no copy on the
    # replica, so not among the records the reverse copy continues with.
    uncopied: int = 0

    def __call__(
        self, tables: list[Table], reader: Replica, anchor: tuple[int, RecordId]
    ) -> Alignment:
        """Align the reverse copy from ``anchor`` (its offset there, and its identity)."""
        where = (
            f"pipeline {self.pipeline!r}: {self.key[0]}[{self.key[1]}] -> {self.reverse_topic}"
            f"[{self.key[1]}] (via origin {self.origin[0]}[{self.origin[1]}])"
        )
        origin, replica = self.origin_cluster, self.replica_cluster
        matches = locate(tables, self.origin, anchor[1], self.committed_before, origin)
        after = ingested_tail(tables, *self.key, self.replica_start, self.source_next, replica)
        found: list[Alignment] = []
        refusal: FailoverRefusedError | None = None
        for origin_offset in matches:
            tail = ingested_tail(
                tables, *self.origin, origin_offset + 1, self.committed_before, origin
            )
            tail = tail[: max(0, len(tail) - self.uncopied)]  # never copied to the replica
            records = [r for _, r in tail + after]
            count = sys.maxsize if self.source_down else len(records) + 1
            copies, end = reader.read(self.reverse_topic, self.key[1], anchor[0] + 1, count)
            try:
                aligned = align_exact(records, copies, end, where, self.source_down)
                found.append(self._uncopied(aligned, after, where))
            except FailoverRefusedError as exc:
                refusal = exc
        if len(found) == 1:
            return found[0]
        if refusal is not None and len(matches) == 1:
            raise refusal
        raise FailoverRefusedError(
            f"{where}: reverse copy offset {anchor[0]} matches {len(matches)} record(s) the "
            f"table read from the origin before the failover, and {len(found)} of them continue "
            "like the reverse copy: it is not a copy of what the table ingested, or records "
            "repeat (same timestamp and key); nothing was changed, the pipeline keeps reading "
            "the replica"
        )

    def _uncopied(self, aligned: Alignment, after: Records, where: str) -> Alignment:
        """With the replica lost: the records read on it the reverse copy lacks, as the plan
        records them (``ingestion.dr.late_copies.guard``); refused when they reach back before the
        failover (records read on the primary have no copy to come late from the replica)."""
        if not aligned.uncopied:
            return aligned
        if aligned.uncopied > len(after):
            raise FailoverRefusedError(
                f"{where}: the reverse copy ends before the records the table read on the "
                f"replica since the failover ({len(after)}; {aligned.uncopied} have no copy on "
                "the primary): MM2's reverse flow has not copied what the replica held before "
                "it, so its position cannot be placed. Nothing was changed, the pipeline keeps "
                "reading the replica. Inspect the reverse copy on the primary: MM2's "
                "reverse flow must have copied the replica from before the failover's start"
            )
        tail = after[len(after) - aligned.uncopied :]
        return dataclasses.replace(aligned, uncopied_records=uncopied_records(tail))
