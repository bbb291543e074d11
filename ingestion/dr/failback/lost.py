"""A failback whose replica is lost (``--to primary --source-lost``): its copies without reading it.

The second disaster: the pipeline reads replica ``dr`` after a failover, and ``dr`` is lost. A
failback normally reads the replica to tell the origin's records MM2's forward flow copied there
from the unreplicated tail (``ingestion.dr.failback.copies``). With the replica unreadable the
operator asserts it is lost (``--source-lost``), and each origin partition is aligned
(:func:`~ingestion.dr.align.split_tail`, same rules: a prefix, refused when a match by
timestamp and key repeats or the evidence contradicts) with what still shows the replica
partition from the failover's start, in its order:

1. the table's rows read on the replica below the table's position there (timestamp and key; under
   MM2's ``identity`` naming only the rows recording the replica in ``_kafka_cluster``), at their
   replica offsets;
2. then the reverse copy on the primary (MM2's reverse flow, replica -> primary) from where the
   failback resumes it (after the copies of ingested records): the replica's records after the
   table's position, byte for byte (value and headers too). They arrive through the reverse copy,
   so the origin skips them. They carry stand-in offsets from the table's position on, in order
   (their replica offsets are not readable; only their order matters, and that they are at or
   after the table's position).

MM2's forward offset syncs on the primary still pin the copied prefix when they name a replica
offset among the rows; one beyond them is not used (its record cannot be read).

What the operator accepts, and what stays exactly once: the replica's records that MM2's reverse
flow had not copied to the primary are lost; every record that still exists (on the origin, in
the reverse copy, in the table) is read once. An origin tail record MM2's forward flow copied to
the replica after the table's position, and the reverse flow did not copy back, is invisible
here: the origin's original is read, and the switch guards it (``ingestion.dr.late_copies.origin``).
If the replica comes back and the reverse flow copies that copy late, runs skip it byte for byte,
as they skip late copies of the records the table ingested on the replica without a reverse copy
(``ingestion.dr.late_copies.guard``). Reads only; retrying is safe.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException

from ingestion.dr.replica_reader import Replica
from ingestion.dr.rows import Records, ingested_tail_where
from ingestion.dr.scanned_rows import ScannedRows
from ingestion.exceptions import FailoverRefusedError, ReadError
from ingestion.kafka.ranges import Key

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from ingestion.dr.failover import PartitionPlan

FAILOVER_SOURCE_LOST = "kafka.failover-source-lost"  # on a failback's switch: lost_summary()


@dataclass(frozen=True)
class LostReplica:
    """The replica a failback leaves, lost: its records as the table and the primary's reverse
    copy show them. ``reverse`` reads the primary; ``resumes`` maps each replica partition to
    its reverse copy partition and the offset the failback resumes it at (the plan's)."""

    name: str
    reverse: Replica
    resumes: dict[Key, tuple[str, int]]

    @classmethod
    def from_plans(cls, name: str, reverse: Replica, plans: list[PartitionPlan]) -> LostReplica:
        """From the failback's plan of the replica partitions the table read."""
        resumes = {(p.source_topic, p.partition): (p.replica_topic, p.replica_start) for p in plans}
        return cls(name, reverse, resumes)

    def exists(self, key: Key) -> bool:
        """Whether the table read the replica partition ``key`` (else no copy is known there)."""
        return key in self.resumes

    def copies(
        self,
        tables: list[Table],
        key: Key,
        start: int,
        replica_next: int,
        where: str,
        cluster: str | None = None,
        scanned: ScannedRows | None = None,
    ) -> tuple[Records, int]:
        """Replica partition ``key`` from the failover's ``start``, as the table's rows below
        ``replica_next`` (read on ``cluster``, if given) and then the reverse copy beyond the
        table's position (stand-in offsets from ``replica_next``), and the stand-in end.
        ``scanned``: the table's rows of ``key``'s topic read on ``cluster``, when the plan
        scanned them already (``ingestion.dr.scanned_rows``); a window it does not cover is scanned
        here."""
        rows = scanned.window(key[1], start, replica_next) if scanned is not None else None
        if rows is None:
            rows = ingested_tail_where(
                tables, key, f"_kafka_offset >= {start} AND _kafka_offset < {replica_next}", cluster
            )
        resume = self.resumes.get(key)
        if resume is None:
            return rows, replica_next
        topic, first = resume
        try:
            beyond, _ = self.reverse.read(topic, key[1], first, sys.maxsize)
        except (KafkaException, ReadError) as exc:
            raise FailoverRefusedError(
                f"{where}: the reverse copy {topic}[{key[1]}] on the primary cannot be read "
                f"({exc}); nothing was changed, the pipeline keeps reading the replica"
            ) from exc
        records = [(replica_next + n, record) for n, (_, record) in enumerate(beyond)]
        return rows + records, replica_next + len(records)

    def usable_anchor(self, anchor: tuple[int, int] | None, replica_next: int) -> bool:
        """Whether MM2's forward sync ``U -> D`` names a replica offset among the table's rows."""
        return anchor is not None and anchor[1] < replica_next


def describe_lost(plans: list[PartitionPlan], replica: str, pipeline: str) -> list[str]:
    """The plan's lines of a failback that leaves a lost replica: what the operator accepts."""
    ahead = {f"{p.source_topic}[{p.partition}]": p.uncopied for p in plans if p.uncopied}
    counts = ", ".join(f"{k}: {n}" for k, n in sorted(ahead.items())) or "none"
    return [
        f"note: --source-lost: replica {replica!r} is lost by the operator's assertion. The "
        f"records written on {replica!r} that MM2's reverse flow had not copied to the primary "
        "are lost; every record that still exists (the origin, the reverse copy, the table) is "
        "read once",
        f"note: the table ingested records on {replica!r} beyond the reverse copy (no copy on "
        f"the primary yet), per partition: {counts}. The switch records them: if {replica!r} "
        "comes back and MM2 copies them late, runs skip each byte-for-byte copy (reading "
        f"{replica!r}; while it does not answer such a run refuses, until `platform "
        f"release-late-copies {pipeline} --reason ...`)",
        f"note: the copies on {replica!r} of the origin's tail are not re-read before the "
        f"commit ({replica!r} is lost); MM2's forward flow must stay stopped. The switch "
        "records the origin records the failback reads: if "
        f"{replica!r} comes back and MM2's reverse flow copies a copy of one late, runs skip "
        "it byte for byte (reading the primary)",
    ]


def lost_summary(plans: list[PartitionPlan], replica: str) -> dict[str, object]:
    """What the switch records of the operator's assertion (``kafka.failover-source-lost``)."""
    return {
        "lost": replica,
        "accepted": (
            f"records written on {replica!r} and not copied back by MirrorMaker 2 are lost by "
            "the operator's assertion"
        ),
        "ingested_beyond_reverse_copy": {
            f"{p.source_topic}:{p.partition}": p.uncopied for p in plans if p.uncopied
        },
    }
