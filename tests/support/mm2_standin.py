"""A stand-in for MirrorMaker 2 between two embedded brokers, for the states real MM2 cannot be
driven into (e.g. its checkpoint connector checkpointing a group ahead of what its source
connector copied: dedicated mode cannot pause one connector). Everything else runs real MM2
(``tests/support/mirror_maker.py``); where the two differ, and the three tests that keep the
stand-in: docs/disaster-recovery.md, "Verified on real MirrorMaker 2"; each of them says why.

It does what MM2's three connectors do, in MM2's formats and with MM2's semantics:

- **source connector**: copies each record of the mirrored topics (key, value, headers,
  timestamp, partition) to ``<source alias>.<topic>`` (or the same name under the identity
  policy) and writes an offset sync (``mm2-offset-syncs.<target alias>.internal`` on the source
  cluster) for a partition's first record and then every ``sync_every`` records, as
  ``offset.lag.max`` does;
- **checkpoint connector**: for each group with committed offsets on the source, translates each
  offset through the syncs it has written, MM2's way (``OffsetSyncStore.translateDownstream``:
  the newest sync at or before the offset, plus one if past it: conservative), and writes a
  checkpoint to ``<source alias>.checkpoints.internal`` on the target. A group without committed
  offsets gets no checkpoint, as in MM2 ("0 consumer groups").

The translation is re-implemented here on purpose, from MM2's source, not imported from the
engine: the failover code reads these records from Kafka and must not share this code.
Call :meth:`step` to replicate and checkpoint once (tests stay deterministic).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka.admin import AdminClient, NewTopic

from ingestion.dr.mm2 import Checkpoint, OffsetSync, encode_checkpoint, encode_offset_sync
from ingestion.kafka.consumer import iter_range, open_consumer
from ingestion.kafka.ranges import OffsetRange
from ingestion.kafka.topics import query_watermarks
from ingestion.pipeline.mirror import wait_for_group_coordinator


@dataclass
class MirrorStandIn:
    """Mirror ``topics`` from ``source`` to ``target`` (bootstrap servers) under MM2's naming."""

    source: str
    target: str
    topics: list[str]
    groups: list[str]
    source_alias: str = "primary"
    target_alias: str = "backup"
    identity: bool = False
    sync_every: int = 10
    # Copy each partition's new records in one transaction, as MM2 does with exactly-once
    # support: commit markers then take replica offsets, so copies and originals drift apart.
    transactional: bool = False
    checkpoints_partitions: int = 1
    checkpoints_config: dict[str, str] = field(
        default_factory=lambda: {"cleanup.policy": "compact"}
    )
    _positions: dict[tuple[str, int], int] = field(default_factory=dict)
    _syncs: dict[tuple[str, int], list[tuple[int, int]]] = field(default_factory=dict)

    def remote(self, topic: str) -> str:
        return topic if self.identity else f"{self.source_alias}.{topic}"

    @property
    def checkpoints_topic(self) -> str:
        return f"{self.source_alias}.checkpoints.internal"

    @property
    def syncs_topic(self) -> str:
        return f"mm2-offset-syncs.{self.target_alias}.internal"

    def setup(self) -> MirrorStandIn:
        """Create the copies (same partition counts) and MM2's internal topics."""
        source, target = self._admin(self.source), self._admin(self.target)
        metadata = source.list_topics(timeout=10).topics
        copies = [NewTopic(self.remote(t), len(metadata[t].partitions), 1) for t in self.topics]
        checkpoints = NewTopic(
            self.checkpoints_topic, self.checkpoints_partitions, 1, config=self.checkpoints_config
        )
        for name, future in target.create_topics([*copies, checkpoints]).items():
            try:
                future.result(timeout=10)
            except KafkaException as exc:  # one checkpoints topic per source: shared by flows
                shared = name == self.checkpoints_topic
                if not shared or exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        syncs = NewTopic(self.syncs_topic, 1, 1, config={"cleanup.policy": "compact"})
        for future in source.create_topics([syncs]).values():
            try:
                future.result(timeout=10)
            except KafkaException as exc:  # shared by every MM2 flow to this target: fine
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        return self

    def step(self) -> int:
        """Replicate what is new, then checkpoint every group; the number of records copied."""
        copied = self.replicate()
        self.checkpoint()
        return copied

    def replicate(self) -> int:
        copied = 0
        settings: dict[str, Any] = {"bootstrap.servers": self.target, "enable.idempotence": True}
        if self.transactional:
            settings["transactional.id"] = f"mm2-standin-{self.source_alias}"
        target = Producer(settings)
        if self.transactional:
            target.init_transactions(10)
        syncs = Producer({"bootstrap.servers": self.source})
        with open_consumer({"bootstrap.servers": self.source}, "mm2-standin") as consumer:
            metadata = consumer.list_topics(timeout=10).topics
            for topic in self.topics:
                for partition in sorted(metadata[topic].partitions):
                    key = (topic, partition)
                    _, high = query_watermarks(consumer, topic, partition, 10)
                    start = self._positions.get(key, 0)
                    rng = OffsetRange(topic, partition, start, high)
                    if self.transactional and high > start:
                        target.begin_transaction()
                    for message in iter_range(consumer, rng, 30, "mm2 stand-in"):
                        downstream = self._copy(target, topic, partition, message)
                        copied += 1
                        self._maybe_sync(syncs, key, int(message.offset() or 0), downstream)
                    if self.transactional and high > start:
                        target.commit_transaction(10)
                    self._positions[key] = high
        return copied

    def _copy(self, producer: Producer, topic: str, partition: int, message: Any) -> int:
        written: list[int] = []
        producer.produce(
            self.remote(topic),
            value=message.value(),
            key=message.key(),
            headers=message.headers(),
            partition=partition,
            timestamp=message.timestamp()[1],
            on_delivery=lambda err, msg: written.append(-1 if err else (msg.offset() or 0)),
        )
        producer.flush(10)
        (offset,) = written
        assert offset >= 0, "the stand-in failed to copy a record"
        return offset

    def _maybe_sync(self, producer: Producer, key: tuple[str, int], up: int, down: int) -> None:
        known = self._syncs.setdefault(key, [])
        if known and up - known[-1][0] < self.sync_every:
            return
        known.append((up, down))
        record_key, value = encode_offset_sync(OffsetSync(key[0], key[1], up, down))
        producer.produce(self.syncs_topic, value=value, key=record_key, partition=0)
        producer.flush(10)  # one record per batch: see ``checkpoint``

    def translate(self, key: tuple[str, int], upstream: int) -> int | None:
        """MM2's ``translateDownstream``: newest sync at or before, plus one past it."""
        before = [(u, d) for u, d in self._syncs.get(key, []) if u <= upstream]
        if not before:
            return None
        u, d = before[-1]
        return d + (0 if u == upstream else 1)

    def checkpoint(self) -> int:
        written = 0
        producer = Producer({"bootstrap.servers": self.target})
        admin = self._admin(self.source)
        listed = admin.list_consumer_group_offsets
        for group in self.groups:
            wait_for_group_coordinator(
                admin, group, 10
            )  # librdkafka #5040 (ingestion/pipeline/mirror)
            (future,) = listed([ConsumerGroupTopicPartitions(group)]).values()
            for tp in future.result(timeout=10).topic_partitions or []:
                if tp.topic not in self.topics or tp.offset < 0:
                    continue
                downstream = self.translate((tp.topic, tp.partition), tp.offset)
                if downstream is None:
                    continue
                checkpoint = Checkpoint(
                    group, self.remote(tp.topic), tp.partition, tp.offset, downstream
                )
                record_key, value = encode_checkpoint(checkpoint)
                producer.produce(self.checkpoints_topic, value=value, key=record_key, partition=0)
                # One record per batch: Tansu 0.6 reports a partition's end as its last batch's
                # base offset + 1, so later records of a multi-record batch would be unreadable.
                producer.flush(10)
                written += 1
        return written

    @staticmethod
    def _admin(bootstrap: str) -> AdminClient:
        return AdminClient({"bootstrap.servers": bootstrap})
