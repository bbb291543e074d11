"""The origin records a ``--source-lost`` failback reads, guarded against MM2's late copies (R55).

A failback from a lost replica (``ingestion.dr.failback.lost``) reads each origin partition from the
first record it found no copy of: the RPO tail (R49). What it cannot see: copies of those records
that MM2's forward flow made on the replica beyond the table's position there, which the reverse
flow had not copied back when the replica was lost. If the replica comes back and its reverse flow
copies on, such a copy arrives in the reverse copy the route reads, in the same partition:
under ``replication_policy: default`` (failback ``identity``) the replica's ``primary.orders``
is copied to the primary's ``primary.orders``; under ``identity`` (failback ``default``) the
replica's ``orders`` to the primary's ``dr.orders``; in both, the failback plan's replica topic
of that copy. Read, each such record would land twice.

So the switch records the tail records it reads in the late-copy guard
(``ingestion.dr.late_copies.guard``)
as entries of those reverse-copy partitions, ``from`` the primary with the origin topic as
``source_topic``, next to the entries of the same partitions from earlier switches: a run that
meets a record with one's timestamp and key compares it byte for byte with the origin's record on
the primary and skips it only when equal (R54's rule). Records producers write to the origin after
the plan are not recorded: the replica was lost before them, MM2 cannot have copied them there.
Reads only (the primary); retrying is safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from confluent_kafka import KafkaException

from ingestion.dr.align import uncopied_records
from ingestion.dr.late_copies.guard import Entries, Uncopied
from ingestion.exceptions import FailoverRefusedError, ReadError
from ingestion.table.route import PRIMARY

if TYPE_CHECKING:
    from ingestion.dr.failback.origin import OriginPlan
    from ingestion.dr.failover import PartitionPlan
    from ingestion.dr.replica_reader import Replica


def origin_entries(
    primary: Replica, origin: list[OriginPlan], plans: list[PartitionPlan], pipeline: str
) -> Entries:
    """The guard's entries for the origin records a failback reads (``origin``: its plan of the
    origin partitions, ``plans``: its plan of the replica partitions, whose replica topic is the
    reverse copy), read on ``primary`` from each partition's resume position, as many as the
    plan counted.

    Raises:
        FailoverRefusedError: an origin partition cannot be read (nothing was changed).
    """
    reverse = {p.source_topic: p.replica_topic for p in plans}
    entries: Entries = []
    for line in origin:
        copy = reverse.get(line.replica_topic)
        if not line.tail or copy is None:  # nothing read, or no reverse copy on the route
            continue
        try:
            records, _ = primary.read(line.topic, line.partition, line.resume, line.tail)
        except (KafkaException, ReadError, FailoverRefusedError) as exc:
            raise FailoverRefusedError(
                f"pipeline {pipeline!r}: origin {line.topic}[{line.partition}] on the primary "
                f"cannot be read from offset {line.resume} to record the tail the failback reads "
                f"against MM2's late copies ({exc}); nothing was changed, the pipeline keeps "
                "reading the replica. Fail back again once the primary answers"
            ) from exc
        uncopied = Uncopied(PRIMARY, line.topic, uncopied_records(records))
        entries.append(((copy, line.partition), uncopied))
    return entries
