"""What the replica holds of the origin's tail when a failback is planned, and at its commit.

MM2's forward flow (primary -> replica) resumes when the primary is back, unless it is stopped:
it then copies the origin's unreplicated tail onto the replica, after whatever the replica's
own producers wrote there since the failover. Those copies reach the pipeline after the
failback whether or not it ingested them on the replica: ingested already, or through the
reverse copy, which resumes after the last ingested record. So an origin record is *copied*
when its copy is anywhere in the replica partition from the failover's start position to the
replica's end, not only among the table's rows (``docs/reliability.md``, R49). The records still
in Kafka on the replica are read there, ingested or not (with a digest of value and headers, which
MM2 copies byte for byte: ``ingestion.dr.align.split_tail``); the table's rows stand in
only for the ingested records retention deleted (timestamp and key only), and must agree with the
replica's records where both exist. A partition the replica's copy does not have (yet) holds no
copies.

The replica must answer: if it does not, copied and uncopied records cannot be told apart and
the failback is refused (:class:`~ingestion.exceptions.FailoverRefusedError`, nothing changed),
unless the operator asserts it is lost (``--source-lost``: ``ingestion.dr.failback.lost``).
Copies the forward flow makes after the plan would arrive twice; MM2's forward flow must be
stopped before failing back, and :func:`recheck_copies` refuses the switch when the replica
got a copy of a planned tail record since the plan. Reads only; retrying is safe.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from confluent_kafka import KafkaException

from ingestion.dr.align import by_identity
from ingestion.dr.replica_reader import Replica
from ingestion.dr.rows import Records, ingested_tail_where
from ingestion.dr.scanned_rows import ScannedRows
from ingestion.exceptions import FailoverRefusedError, ReadError
from ingestion.kafka.ranges import Key

if TYPE_CHECKING:
    from pyiceberg.table import Table


class PlannedOrigin(Protocol):
    """What :func:`recheck_copies` reads of a failback's per-partition origin plan
    (``ingestion.dr.failback.origin.OriginPlan``; not imported: that module imports this one)."""

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
    "once the replica answers; if it is lost (the second disaster), say so with --source-lost "
    "(job config source_lost): the records written on it that MM2's reverse flow did not copy "
    "back are then lost by that assertion (docs/reliability.md, R55)"
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


def copy_exists(reader: Replica, key: Key, where: str) -> bool:
    """Whether the replica's copy topic has partition ``key[1]`` (a partition added to the
    origin may not be copied yet)."""
    try:
        return key[1] in reader.describe(key[0])[1]
    except (KafkaException, ReadError, FailoverRefusedError) as exc:
        raise FailoverRefusedError(f"{where}: " + UNREACHABLE.format(error=exc)) from exc


def replica_copies(
    tables: list[Table],
    reader: Replica,
    key: Key,
    start: int,
    replica_next: int,
    where: str,
    cluster: str | None = None,
    scanned: ScannedRows | None = None,
) -> tuple[Records, int]:
    """The replica partition ``key`` from the failover's ``start`` to its end now, as (offset,
    RecordId) in offset order, and the end: the records in Kafka from the log start (from
    ``replica_next``, the table's next offset there, if retention deleted records not ingested yet:
    refused), below that the table's rows (no value digest; read on ``cluster``, the replica, when
    given: ``ingestion.dr.cluster_rows``). ``scanned``: the table's rows of ``key``'s topic read on
    ``cluster``, when the caller scanned them already (one scan for every partition:
    ``ingestion.dr.scanned_rows``); a window it does not cover is scanned here."""
    try:
        low, _ = reader.watermarks(*key)
    except (KafkaException, ReadError) as exc:
        raise FailoverRefusedError(f"{where}: " + UNREACHABLE.format(error=exc)) from exc
    first = max(start, min(low, replica_next))
    ingested = scanned.window(key[1], start, replica_next) if scanned is not None else None
    if ingested is None:
        ingested = ingested_tail_where(
            tables, key, f"_kafka_offset >= {start} AND _kafka_offset < {replica_next}", cluster
        )
    kept, end = read_replica(reader, key, first, where)
    held = {offset for offset, _ in kept}
    rows = dict(ingested)
    for offset, record in kept:
        row = rows.get(offset)
        if row is not None and not row.matches(record):
            raise FailoverRefusedError(
                f"{where}: {key[0]}[{key[1]}] on the replica holds at offset {offset} {record}, "
                f"the table's row there is {row}: the replica topic was recreated or rewritten "
                "since the table read it. Nothing was changed; the pipeline keeps reading the "
                "replica. Inspect the replica topic"
            )
    missing = [(offset, row) for offset, row in ingested if offset not in held]
    return sorted(missing + kept, key=lambda item: item[0]), end


def recheck_copies(
    plans: Sequence[PlannedOrigin], replica: Replica, origin: Replica, pipeline: str
) -> None:
    """Refuse the switch when a record the replica got since the plan is a copy of an origin
    record from the planned resume position (timestamp, key, value and headers: MM2's forward
    flow still runs; another producer's record is no copy): the origin and
    the reverse copy would both deliver it. Called just before the commit; nothing changed."""
    for plan in plans:
        where = f"pipeline {pipeline!r}: failback of origin {plan.topic}[{plan.partition}]"
        key = (plan.replica_topic, plan.partition)
        if plan.replica_end == 0 and not copy_exists(replica, key, where):
            continue  # the replica's copy has no such partition: nothing was copied there
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
        identities = by_identity(tail)
        for offset, record in added:
            same = identities.get((record.timestamp_ms, record.key), [])
            copied = next((o for o, r in same if r.matches(record)), None)
            if copied is not None:
                raise FailoverRefusedError(
                    f"{where}: since the plan, the replica got at {key[0]}[{key[1]}] offset "
                    f"{offset} a copy of origin offset {copied}, which the plan "
                    f"reads from the origin (replica end {plan.replica_end} when planned, "
                    f"{end} now): MM2's forward flow still runs, and the record would land "
                    "twice. Nothing was changed; the pipeline keeps reading the replica. Stop "
                    "the forward flow (primary -> replica), then fail back again"
                )
