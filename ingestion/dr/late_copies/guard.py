"""MirrorMaker 2's late copies after a ``--source-lost`` failover: each record once (R54).

A failover with ``--source-lost`` accepts a table ahead of MM2's copy: the table ingested
records from the source that MM2 had not copied yet (``uncopied`` in the plan,
``ingestion.dr.align.align_exact``). When the source comes back, MM2's forward flow
resumes where it stopped and copies them into the topic the pipeline now reads on the replica;
read there, each would land twice.

The switch records them in the table property ``kafka.uncopied.<group>`` (a table property
outlives snapshot expiry; every switch rewrites it): per replica partition, one *entry* per
cluster and topic the table read them from (``from``, ``source_topic``), each with its records'
source offsets, Kafka timestamps and key digests. A partition may hold several entries: a chain
of both disasters keeps the failover's uncopied records (from the primary), the failback's
(from the replica it left) and the origin records that failback reads (from the primary,
``ingestion.dr.late_copies.origin``). Tables written before kept one entry per partition: the same
JSON, read the same way. A run on that route gives each task the (timestamp, key digest) pairs
of its partition, the union over its entries. A record carrying one is a *candidate*: the task
sets it aside and asks for a rerun, naming the pairs it met. The coordinator reads, for each
entry one of them belongs to, those records where the entry says the table read them, and
reruns the task with a digest of each one's timestamp, key, value and headers: a candidate equal
byte for byte to a record of any of its entries is a late copy, skipped and recorded in the
commit (``kafka.late-copies``: the replica offsets); a candidate equal to none is another record
that shares a timestamp and key, and is ingested.

Delivery: a record is skipped only when it is byte for byte one the table ingested. When a
cluster a candidate's entry needs does not answer, the run refuses
(:class:`LateCopyUnverifiedError`, naming it) and commits nothing: a stall with a message,
never a guess. Both audits count the skipped records with the
quarantined ones. Cost: nothing on a route without uncopied records; on one with them, a set
lookup of each record's timestamp, reading the table property once per run on the driver (tasks
get only their partition's share), and, in runs that meet a candidate, a second read and decode
of each task that met one (``bench/run.py --suite late-copies``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ingestion.dr.align import RecordId, key_digest
from ingestion.exceptions import LateCopyUnverifiedError
from ingestion.table.route import FAILOVER_TO, active_switch

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from ingestion.dr.failover import PartitionPlan
    from ingestion.dr.replica_reader import Replica

UNCOPIED_PREFIX = "kafka.uncopied."  # table property, per group: JSON, see module docstring
RELEASED = "kafka.late-copies-released"  # on the release's snapshot: records released

WeakId = tuple[int, str | None]  # (Kafka timestamp ms, key digest)
Key = tuple[str, int]  # (replica topic, partition)
SOURCE_TIMEOUT_S = 10.0  # a cluster that does not answer a metadata request within this is down


def strong_id(timestamp_ms: int, key: bytes | None, value_digest: bytes) -> bytes:
    """A record's identity byte for byte: timestamp, key, and ``digest_record`` of its value
    and headers."""
    digest = hashlib.blake2b(timestamp_ms.to_bytes(8, "big", signed=True), digest_size=16)
    digest.update(b"\xff" * 8 if key is None else len(key).to_bytes(8, "big") + key)
    digest.update(value_digest)
    return digest.digest()


@dataclass(frozen=True)
class Uncopied:
    """One entry: records a replica partition lacked at a ``--source-lost`` switch (or that a
    failback read from the origin), and where the table read them (cluster ``source``,
    ``source_topic``, same partition)."""

    source: str
    source_topic: str
    records: tuple[tuple[int, int, str | None], ...]  # (source offset, timestamp ms, key digest)

    @property
    def weak_ids(self) -> frozenset[WeakId]:
        """The (timestamp, key digest) pairs a task matches."""
        return frozenset((stamp, key) for _, stamp, key in self.records)


Entries = list[tuple[Key, Uncopied]]  # entries under the replica partition they guard


def guard_entries(entries: Entries) -> list[dict[str, Any]]:
    """The property's JSON entries: one per replica partition, cluster and source topic
    (entries naming the same three are merged, their records once each, by source offset).

    Example:
        >>> a, b = Uncopied("primary", "t", ((4, 1, "k"),)), Uncopied("dr", "p.t", ((2, 3, None),))
        >>> [(e["from"], e["records"]) for e in guard_entries([(("p.t", 0), a), (("p.t", 0), b),
        ...     (("p.t", 0), Uncopied("primary", "t", ((3, 1, "j"), (4, 1, "k"))))])]
        [('dr', [(2, 3, None)]), ('primary', [(3, 1, 'j'), (4, 1, 'k')])]
    """
    merged: dict[tuple[str, int, str, str], dict[int, tuple[int, int, str | None]]] = {}
    for (topic, partition), entry in entries:
        records = merged.setdefault((topic, partition, entry.source, entry.source_topic), {})
        records.update((record[0], record) for record in entry.records)
    return [
        {
            "topic": topic,
            "partition": partition,
            "from": source,
            "source_topic": source_topic,
            "records": [records[offset] for offset in sorted(records)],
        }
        for (topic, partition, source, source_topic), records in sorted(merged.items())
        if records
    ]


def uncopied_property(
    group_id: str,
    target: str,
    source: str,
    plans: list[PartitionPlan],
    carried: LateCopyGuard | None = None,
    read: Entries | None = None,
) -> dict[str, str]:
    """The table property a switch from ``source`` to ``target`` sets (always: it replaces an
    older switch's). Its entries: the records the plans found uncopied (from ``source``); every
    entry of a guarded partition of the route left (``carried``), under the name the switch reads
    its copy by (MM2 may copy its late copies on: a failback's reverse flow), so they stay
    skipped after the switch too; and ``read`` (a ``--source-lost`` failback: the origin records
    it reads, ``ingestion.dr.late_copies.origin``). None replaces another."""
    entries: Entries = [
        ((p.replica_topic, p.partition), Uncopied(source, p.source_topic, p.uncopied_records))
        for p in plans
        if p.uncopied_records
    ]
    guarded = carried.partitions if carried is not None else {}
    for p in plans:
        for old in guarded.get((p.source_topic, p.partition), ()):
            entries.append(((p.replica_topic, p.partition), old))
    value = {"to": target, "partitions": guard_entries(entries + list(read or []))}
    return {UNCOPIED_PREFIX + group_id: orjson.dumps(value).decode()}


@dataclass(frozen=True)
class LateCopyGuard:
    """The uncopied records of the route in force: each replica partition's entries."""

    pipeline: str
    partitions: dict[Key, tuple[Uncopied, ...]]

    def weak_ids(self) -> dict[Key, frozenset[WeakId]]:
        """Per replica partition, the pairs a task matches: the union over its entries."""
        return {
            key: frozenset().union(*(entry.weak_ids for entry in entries))
            for key, entries in self.partitions.items()
        }

    def digests(
        self,
        cluster_config: Callable[[str], dict[str, Any]] | None,
        met: dict[Key, set[WeakId]] | None = None,
    ) -> dict[Key, frozenset[bytes]]:
        """Read the records of the entries the candidates ``met`` (per partition, the pairs the
        tasks set aside; None: every entry) where each entry says the table read them: per
        partition, their byte-for-byte identities, over all its entries (a late copy of any is
        skipped). Only the clusters those entries name are read.

        Raises:
            LateCopyUnverifiedError: a cluster needed is not configured or does not answer.
        """
        found: dict[Key, frozenset[bytes]] = {}
        clusters: dict[str, Replica] = {}
        for key, entries in sorted(self.partitions.items()):
            pairs = None if met is None else met.get(key)
            if met is not None and not pairs:
                continue
            strong: set[bytes] = set()
            for entry in entries:
                wanted = {
                    offset: (stamp, kd)
                    for offset, stamp, kd in entry.records
                    if pairs is None or (stamp, kd) in pairs
                }
                if not wanted:
                    continue
                if entry.source not in clusters:
                    clusters[entry.source] = self._open(entry.source, cluster_config)
                records = self._read(clusters[entry.source], entry, key[1], wanted)
                strong.update(
                    strong_id(r.timestamp_ms, r.key, r.value_digest or b"")
                    for offset, r in records
                    if wanted.get(offset) == (r.timestamp_ms, key_digest(r.key))
                )
            found[key] = frozenset(strong)
        return found

    def _read(
        self, source: Replica, entry: Uncopied, partition: int, wanted: dict[int, Any]
    ) -> list[tuple[int, RecordId]]:
        """The records at the entry's offsets ``wanted`` that its cluster still holds."""
        from confluent_kafka import KafkaException

        from ingestion.exceptions import FailoverRefusedError, ReadError

        where = f"{entry.source_topic}[{partition}] on {entry.source!r}"
        try:
            # Retention may have taken the oldest since: MM2 cannot copy them any more (a copy
            # it made before they went, while this platform could not reach the source, is
            # not recognised: the one case left, see R54).
            first = max(min(wanted), source.watermarks(entry.source_topic, partition)[0])
            last = max(wanted)
            if first > last:
                return []
            records, _ = source.read(entry.source_topic, partition, first, last - first + 1)
        except (KafkaException, ReadError, FailoverRefusedError) as exc:
            raise LateCopyUnverifiedError(
                f"pipeline {self.pipeline!r}: reading {where} to tell MirrorMaker 2's late "
                f"copies failed ({exc}); if that cluster is lost for good, `platform "
                f"release-late-copies {self.pipeline} --reason ...` makes runs ingest such "
                "records. Nothing was committed"
            ) from exc
        return records

    def _open(self, source: str, cluster_config: Callable[[str], dict[str, Any]] | None) -> Replica:
        """The cluster ``source`` as a reader, once it answers."""
        from ingestion.dr.replica_reader import Replica, cluster_answers

        config = cluster_config(source) if cluster_config is not None else None
        if config is None or not cluster_answers(config, timeout_s=SOURCE_TIMEOUT_S):
            raise LateCopyUnverifiedError(
                f"pipeline {self.pipeline!r}: a record read now has the timestamp and key of one "
                f"the table ingested from {source!r} that a --source-lost switch recorded "
                f"(MirrorMaker 2 may copy it late): it may be MM2's late copy, and {source!r} "
                "does not answer, so it cannot be compared byte for byte. Make it reachable "
                "from the platform (its kafka configuration), then run again; if it is lost "
                f"for good, `platform release-late-copies {self.pipeline} --reason ...` makes "
                "runs ingest such records. Nothing was committed"
            )
        return Replica(config)


def read_guard(table: Table, group_id: str, pipeline: str) -> LateCopyGuard | None:
    """The guard of the route in force, or None (no ``--source-lost`` switch with uncopied
    records is in force)."""
    raw = table.properties.get(UNCOPIED_PREFIX + group_id)
    parsed = parse_guard(raw, pipeline) if raw else None
    if parsed is None:
        return None
    route = active_switch(table, group_id)
    if route is None or route.get(FAILOVER_TO) != parsed[0]:
        return None  # the route ended (a completion, a reset elsewhere)
    return parsed[1]


def parse_guard(raw: str, pipeline: str) -> tuple[str, LateCopyGuard] | None:
    """The switch target and guard a ``kafka.uncopied.<group>`` value records (None: no entry
    left, e.g. released). Reads both forms: several entries per partition, and the one entry
    per partition of tables written before."""
    value = orjson.loads(raw)
    if not value.get("partitions"):
        return None
    partitions: dict[Key, tuple[Uncopied, ...]] = {}
    for p in value["partitions"]:
        key = (str(p["topic"]), int(p["partition"]))
        records = tuple((int(o), int(t), k) for o, t, k in p["records"])
        entry = Uncopied(str(p["from"]), str(p["source_topic"]), records)
        partitions[key] = (*partitions.get(key, ()), entry)
    return str(value["to"]), LateCopyGuard(pipeline, partitions)
