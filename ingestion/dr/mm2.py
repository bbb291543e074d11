"""MirrorMaker 2's internal records, read and written byte for byte, and its offset translation.

A failover to an MM2 replica needs two of MM2's internal topics (Apache Kafka,
``connect/mirror-client/.../Checkpoint.java`` and ``connect/mirror/.../OffsetSync.java``):

- **offset syncs**, ``mm2-offset-syncs.<target alias>.internal`` (on the source cluster unless
  ``offset-syncs.topic.location=target``): key ``(topic STRING, partition INT32)``, value
  ``(upstreamOffset INT64, offset INT64)``: the source record at ``upstreamOffset`` of the
  *source* topic was written at ``offset`` of the replica topic. An exact anchor.
- **checkpoints**, ``<source alias>.checkpoints.internal`` (on the target cluster, one partition,
  compacted): key ``(group STRING, topic STRING, partition INT32)`` where the topic is the
  *replica's* name; value ``(version INT16 = 0)`` followed by ``(upstreamOffset INT64, offset
  INT64, metadata STRING)``: the group's committed source offset and its conservative translation.

Kafka's protocol types are big-endian; a ``STRING`` is an INT16 byte length, then UTF-8. Pure
functions, no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ingestion.exceptions import ReplicaFormatError

CHECKPOINT_VERSION = 0
ReplicationPolicy = Literal["default", "identity"]


@dataclass(frozen=True)
class OffsetSync:
    """Source ``topic[partition]`` record ``upstream`` sits at replica offset ``downstream``."""

    topic: str
    partition: int
    upstream: int
    downstream: int


@dataclass(frozen=True)
class Checkpoint:
    """Group ``group``'s source offset ``upstream`` translates to ``downstream`` on the replica
    topic ``topic`` (the replica's name for the source topic)."""

    group: str
    topic: str
    partition: int
    upstream: int
    downstream: int
    metadata: str = ""


class _Reader:
    """Reads Kafka protocol types from one buffer; raises ReplicaFormatError when it runs out."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.position, self.what = data, 0, what

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.position + size > len(self.data):
            raise ReplicaFormatError(f"{self.what}: truncated after {self.position} bytes")
        (value,) = struct.unpack_from(fmt, self.data, self.position)
        self.position += size
        return int(value)

    def string(self) -> str:
        length = self.take(">h")
        if length < 0 or self.position + length > len(self.data):
            raise ReplicaFormatError(f"{self.what}: bad string length {length}")
        raw = self.data[self.position : self.position + length]
        self.position += length
        return raw.decode("utf-8")


def _string(value: str) -> bytes:
    raw = value.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def encode_offset_sync(sync: OffsetSync) -> tuple[bytes, bytes]:
    """The (key, value) bytes MM2 writes for ``sync``.

    Example:
        >>> key, value = encode_offset_sync(OffsetSync("t", 1, 5, 7))
        >>> key.hex(" "), value.hex(" ", 8)
        ('00 01 74 00 00 00 01', '0000000000000005 0000000000000007')
    """
    key = _string(sync.topic) + struct.pack(">i", sync.partition)
    return key, struct.pack(">qq", sync.upstream, sync.downstream)


def decode_offset_sync(key: bytes, value: bytes) -> OffsetSync:
    """Read one record of an offset-syncs topic; raise ReplicaFormatError if it is not one."""
    keys, values = _Reader(key, "offset sync key"), _Reader(value, "offset sync value")
    topic, partition = keys.string(), keys.take(">i")
    return OffsetSync(topic, partition, values.take(">q"), values.take(">q"))


def encode_checkpoint(checkpoint: Checkpoint) -> tuple[bytes, bytes]:
    """The (key, value) bytes MM2's checkpoint connector writes for ``checkpoint``."""
    key = (
        _string(checkpoint.group)
        + _string(checkpoint.topic)
        + struct.pack(">i", checkpoint.partition)
    )
    value = struct.pack(
        ">hqq", CHECKPOINT_VERSION, checkpoint.upstream, checkpoint.downstream
    ) + _string(checkpoint.metadata)
    return key, value


def decode_checkpoint(key: bytes, value: bytes) -> Checkpoint:
    """Read one record of a checkpoints topic; raise ReplicaFormatError if it is not one."""
    keys, values = _Reader(key, "checkpoint key"), _Reader(value, "checkpoint value")
    group, topic, partition = keys.string(), keys.string(), keys.take(">i")
    version = values.take(">h")
    if version != CHECKPOINT_VERSION:
        raise ReplicaFormatError(f"checkpoint value version {version}; this reader knows 0")
    upstream, downstream = values.take(">q"), values.take(">q")
    return Checkpoint(group, topic, partition, upstream, downstream, values.string())


def replica_topic(topic: str, source_alias: str, policy: ReplicationPolicy = "default") -> str:
    """The replica's name for a source topic under MM2's replication policy.

    Example:
        >>> replica_topic("orders", "primary"), replica_topic("orders", "primary", "identity")
        ('primary.orders', 'orders')
    """
    return topic if policy == "identity" else f"{source_alias}.{topic}"


def checkpoints_topic(source_alias: str) -> str:
    """Where MM2 writes checkpoints on the target cluster."""
    return f"{source_alias}.checkpoints.internal"


def offset_syncs_topic(target_alias: str) -> str:
    """Where MM2 writes offset syncs (on the source cluster by default)."""
    return f"mm2-offset-syncs.{target_alias}.internal"


def translate_downstream(syncs: Sequence[OffsetSync], upstream: int) -> int | None:
    """MM2's own translation of a source offset to the replica (``OffsetSyncStore``).

    Uses the newest sync at or before ``upstream``; past it, only one offset further is safe
    (records after a sync may or may not have been replicated yet), so the result can sit
    before the true position: conservative, never ahead. None when every sync is newer.

    Example:
        >>> syncs = [OffsetSync("t", 0, 0, 100), OffsetSync("t", 0, 50, 160)]
        >>> translate_downstream(syncs, 50), translate_downstream(syncs, 70)
        (160, 161)
    """
    before = [s for s in syncs if s.upstream <= upstream]
    if not before:
        return None
    anchor = max(before, key=lambda s: s.upstream)
    return anchor.downstream + (0 if anchor.upstream == upstream else 1)
