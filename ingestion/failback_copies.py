"""What the replica holds of the origin's tail when a failback is planned, and at its commit.

MM2's forward flow (primary -> replica) resumes when the primary is back, unless it is stopped:
it then copies the origin's unreplicated tail onto the replica, after whatever the replica's
own producers wrote there since the failover. Those copies reach the pipeline after the
failback whether or not it ingested them on the replica: ingested already, or through the
reverse copy, which resumes after the last ingested record. So an origin record is *copied*
when its copy is anywhere in the replica partition from the failover's start position to the
replica's end, not only among the table's rows (``docs/reliability.md``, R49): the table's rows
below the replica position it committed, then the replica's records in Kafka from there.

The replica must answer: if it does not, copied and uncopied records cannot be told apart and
the failback is refused (:class:`~ingestion.exceptions.FailoverRefusedError`, nothing changed).
Copies the forward flow makes after the plan would arrive twice; MM2's forward flow must be
stopped before failing back, and :func:`recheck_copies` refuses the switch when the replica
got a copy of a planned tail record since the plan. Reads only; retrying is safe.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from confluent_kafka import KafkaException

from ingestion.exceptions import FailoverRefusedError, ReadError
from ingestion.failover import Records, Replica, ingested_tail_where
from ingestion.ranges import Key

if TYPE_CHECKING:
    from pyiceberg.table import Table


class PlannedOrigin(Protocol):
    """What :func:`recheck_copies` reads of a failback's per-partition origin plan
    (``ingestion.failback_origin.OriginPlan``; not imported: that module imports this one)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def resume(self) -> int: ...
    @property
    def replica_topic(self) -> str: ...
    @property
    def replica_end(self) -> int: ...


UNREACHABLE = (
    "the replica cluster does not answer ({error}), so the plan cannot tell the origin records "
    "MM2's forward flow copied there (they arrive through the reverse copy) from the "
    "unreplicated tail. Nothing was changed; the pipeline keeps reading the replica. Fail back "
    "once the replica answers"
)


def read_replica(reader: Replica, key: Key, start: int, where: str) -> tuple[Records, int]:
    """The replica partition's records from ``start`` to its end now, and that end."""
    try:
        return reader.read(key[0], key[1], start, sys.maxsize)
    except (KafkaException, ReadError) as exc:
        raise FailoverRefusedError(f"{where}: " + UNREACHABLE.format(error=exc)) from exc
    except FailoverRefusedError as exc:  # retention deleted records not ingested yet
        raise FailoverRefusedError(
            f"{where}: {exc}; they may be copies of the origin's records"
        ) from exc


def replica_copies(
    tables: list[Table], reader: Replica, key: Key, start: int, replica_next: int, where: str
) -> tuple[Records, int]:
    """The replica partition ``key`` from the failover's ``start`` to its end now, as
    (offset, RecordId) in offset order: the table's rows below ``replica_next`` (the table's
    next offset there), then the records in Kafka from ``replica_next``; and the end."""
    ingested = ingested_tail_where(
        tables, key, f"_kafka_offset >= {start} AND _kafka_offset < {replica_next}"
    )
    pending, end = read_replica(reader, key, replica_next, where)
    return ingested + pending, end


def recheck_copies(
    plans: Sequence[PlannedOrigin], replica: Replica, origin: Replica, pipeline: str
) -> None:
    """Refuse the switch when a record the replica got since the plan is a copy of an origin
    record from the planned resume position (MM2's forward flow still runs): the origin and
    the reverse copy would both deliver it. Called just before the commit; nothing changed."""
    for plan in plans:
        where = f"pipeline {pipeline!r}: failback of origin {plan.topic}[{plan.partition}]"
        key = (plan.replica_topic, plan.partition)
        added, end = read_replica(replica, key, plan.replica_end, where)
        if end < plan.replica_end:
            raise FailoverRefusedError(
                f"{where}: {key[0]}[{key[1]}] on the replica ends at {end}, below "
                f"{plan.replica_end} when planned (recreated or truncated since). Nothing was "
                "changed; plan again"
            )
        if not added:
            continue
        tail, _ = origin.read(plan.topic, plan.partition, plan.resume, sys.maxsize)
        identities = {(r.timestamp_ms, r.key): offset for offset, r in reversed(tail)}
        for offset, record in added:
            copied = identities.get((record.timestamp_ms, record.key))
            if copied is not None:
                raise FailoverRefusedError(
                    f"{where}: since the plan, the replica got at {key[0]}[{key[1]}] offset "
                    f"{offset} a copy of origin offset {copied}, which the plan "
                    f"reads from the origin (replica end {plan.replica_end} when planned, "
                    f"{end} now): MM2's forward flow still runs, and the record would land "
                    "twice. Nothing was changed; the pipeline keeps reading the replica. Stop "
                    "the forward flow (primary -> replica), then fail back again"
                )
