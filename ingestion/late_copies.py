"""MirrorMaker 2's late copies after a ``--source-lost`` failover: each record once (R54).

A failover with ``--source-lost`` accepts a table ahead of MM2's copy: the table ingested
records from the source that MM2 had not copied yet (``uncopied`` in the plan,
``ingestion.failover_align.align_exact``). When the source comes back, MM2's forward flow
resumes where it stopped and copies them into the topic the pipeline now reads on the replica;
read there, each would land twice.

The switch records them in the table property ``kafka.uncopied.<group>`` (a table property
outlives snapshot expiry; every switch rewrites it): per replica partition, each record's
source offset, Kafka timestamp and a digest of its key. A run on that route gives each task
the (timestamp, key digest) pairs of its partition. A record carrying one is a *candidate*:
the task sets it aside and asks for a rerun. The coordinator reads those source offsets on the
source cluster and reruns the task with a digest of each record's timestamp, key, value and
headers: a candidate equal byte for byte to the record the table ingested is a late copy,
skipped and recorded in the commit (``kafka.late-copies``: the replica offsets); any other
candidate is another record that shares a timestamp and key, and is ingested.

Delivery: a record is skipped only when it is byte for byte one the table ingested. When the
source does not answer, the run refuses (:class:`LateCopyUnverifiedError`) and commits
nothing: a stall with a message, never a guess. Both audits count the skipped records with the
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

from ingestion.exceptions import LateCopyUnverifiedError
from ingestion.failover_align import RecordId, key_digest
from ingestion.route_state import FAILOVER_TO, active_switch

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from ingestion.failover import PartitionPlan, Replica
    from ingestion.task_spec import TaskResult

UNCOPIED_PREFIX = "kafka.uncopied."  # table property, per group: JSON, see module docstring
LATE_COPIES = "kafka.late-copies"  # on a run commit: {"topic:partition": [skipped offsets]}
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
    """The records one replica partition lacked at a ``--source-lost`` switch, and where the
    table read them (cluster ``source``, ``source_topic``, same partition)."""

    source: str
    source_topic: str
    records: tuple[tuple[int, int, str | None], ...]  # (source offset, timestamp ms, key digest)

    @property
    def weak_ids(self) -> frozenset[WeakId]:
        """The (timestamp, key digest) pairs a task matches."""
        return frozenset((stamp, key) for _, stamp, key in self.records)


def uncopied_property(
    group_id: str,
    target: str,
    source: str,
    plans: list[PartitionPlan],
    carried: LateCopyGuard | None = None,
) -> dict[str, str]:
    """The table property a switch from ``source`` to ``target`` sets (always: it replaces an
    older switch's). A guarded partition of the route left (``carried``) stays guarded under
    the name the switch reads its copy by: MM2 may copy its late copies on (a failback's
    reverse flow), so they stay skipped after the switch too."""
    partitions = [
        {"topic": p.replica_topic, "partition": p.partition, "from": source,
         "source_topic": p.source_topic, "records": p.uncopied_records}
        for p in plans if p.uncopied_records
    ]  # fmt: skip
    guarded = carried.partitions if carried is not None else {}
    for p in plans:
        old = guarded.get((p.source_topic, p.partition))
        if old is not None and not p.uncopied_records:
            partitions.append(
                {"topic": p.replica_topic, "partition": p.partition, "from": old.source,
                 "source_topic": old.source_topic, "records": old.records}
            )  # fmt: skip
    value = {"to": target, "partitions": partitions}
    return {UNCOPIED_PREFIX + group_id: orjson.dumps(value).decode()}


@dataclass(frozen=True)
class LateCopyGuard:
    """The uncopied records of the route in force, by replica partition."""

    pipeline: str
    partitions: dict[Key, Uncopied]

    def digests(
        self, cluster_config: Callable[[str], dict[str, Any]] | None
    ) -> dict[Key, frozenset[bytes]]:
        """Read the uncopied records where the table read them: their byte-for-byte identities.

        Raises:
            LateCopyUnverifiedError: that cluster is not configured or does not answer.
        """
        found: dict[Key, frozenset[bytes]] = {}
        clusters: dict[str, Replica] = {}
        for key, uncopied in sorted(self.partitions.items()):
            if uncopied.source not in clusters:
                clusters[uncopied.source] = self._open(uncopied.source, cluster_config)
            wanted = {offset: (stamp, kd) for offset, stamp, kd in uncopied.records}
            records = self._read(clusters[uncopied.source], uncopied, key[1], wanted)
            found[key] = frozenset(
                strong_id(r.timestamp_ms, r.key, r.value_digest or b"")
                for offset, r in records
                if wanted.get(offset) == (r.timestamp_ms, key_digest(r.key))
            )
        return found

    def _read(
        self, source: Replica, uncopied: Uncopied, partition: int, wanted: dict[int, Any]
    ) -> list[tuple[int, RecordId]]:
        """The source's records at the uncopied offsets that are still there."""
        from confluent_kafka import KafkaException

        from ingestion.exceptions import FailoverRefusedError, ReadError

        where = f"{uncopied.source_topic}[{partition}] on {uncopied.source!r}"
        try:
            # Retention may have taken the oldest since: MM2 cannot copy them any more (a copy
            # it made before they went, while this platform could not reach the source, is
            # not recognised: the one case left, see R54).
            first = max(min(wanted), source.watermarks(uncopied.source_topic, partition)[0])
            last = max(wanted)
            if first > last:
                return []
            records, _ = source.read(uncopied.source_topic, partition, first, last - first + 1)
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
        from ingestion.failover import Replica, cluster_answers

        config = cluster_config(source) if cluster_config is not None else None
        if config is None or not cluster_answers(config, timeout_s=SOURCE_TIMEOUT_S):
            raise LateCopyUnverifiedError(
                f"pipeline {self.pipeline!r}: a record read now has the timestamp and key of one "
                f"the table ingested from {source!r} before a --source-lost failover (MirrorMaker "
                f"2 had not copied it): it may be MM2's late copy, and {source!r} does not "
                "answer, so it cannot be compared byte for byte. Make it reachable from the "
                "platform (its kafka configuration), then run again; if it is lost for good, "
                f"`platform release-late-copies {self.pipeline} --reason ...` makes runs "
                "ingest such records. Nothing was committed"
            )
        return Replica(config)


def read_guard(table: Table, group_id: str, pipeline: str) -> LateCopyGuard | None:
    """The guard of the route in force, or None (no ``--source-lost`` switch with uncopied
    records is in force)."""
    raw = table.properties.get(UNCOPIED_PREFIX + group_id)
    if not raw:
        return None
    value = orjson.loads(raw)
    if not value.get("partitions"):
        return None
    route = active_switch(table, group_id)
    if route is None or route.get(FAILOVER_TO) != value["to"]:
        return None  # the route ended (a completion, a reset elsewhere)
    partitions = {
        (str(p["topic"]), int(p["partition"])): Uncopied(
            str(p["from"]), str(p["source_topic"]),
            tuple((int(o), int(t), k) for o, t, k in p["records"]),
        )
        for p in value["partitions"]
    }  # fmt: skip
    return LateCopyGuard(pipeline, partitions)


def late_copies_property(results: list[TaskResult]) -> str:
    """The commit's record of the late copies skipped: ``{"topic:partition": [offsets]}``."""
    skipped: dict[str, list[int]] = {}
    for result in results:  # a partition split into several tasks: one list
        if result.late_copies:
            where = f"{result.range.topic}:{result.range.partition}"
            skipped.setdefault(where, []).extend(result.late_copies)
    return orjson.dumps({where: sorted(offsets) for where, offsets in skipped.items()}).decode()


def count_late_copies(properties: dict[str, str]) -> int:
    """The late copies a commit skipped (0 without any).

    Example:
        >>> count_late_copies({LATE_COPIES: '{"dr.t:0": [4, 9], "dr.t:1": [2]}'})
        3
    """
    raw = properties.get(LATE_COPIES)
    return sum(len(offsets) for offsets in orjson.loads(raw).values()) if raw else 0


def skipped_late_copies(table: Table) -> set[tuple[str, int, int]]:
    """Every (topic, partition, offset) the table's commits skipped as late copies."""
    from ingestion.offsets import iter_ancestry, snapshot_properties

    skipped: set[tuple[str, int, int]] = set()
    for snapshot in iter_ancestry(table):
        raw = snapshot_properties(snapshot).get(LATE_COPIES)
        for where, offsets in (orjson.loads(raw) if raw else {}).items():
            topic, _, partition = where.rpartition(":")
            skipped.update((topic, int(partition), int(offset)) for offset in offsets)
    return skipped
