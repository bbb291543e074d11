"""Read-only views of a cluster for a failover or failback plan: a replica partition's records
with their identities (timestamp, key, digest of value and headers), MM2's offset syncs, and
whether a cluster answers.

Every read stops at the end offset it asked first (it never waits for more records) and
commits nothing; a plan may repeat them freely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ingestion.dr.align import RecordId, digest_record
from ingestion.dr.mm2 import OffsetSync, decode_offset_sync
from ingestion.dr.rows import Records
from ingestion.exceptions import FailoverRefusedError
from ingestion.kafka.clients import client_properties
from ingestion.kafka.consumer import iter_batches, iter_range, open_consumer
from ingestion.kafka.ranges import OffsetRange


@dataclass
class Replica:
    """A read-only view of the replica cluster for one plan."""

    kafka_config: dict[str, Any]
    timeout_s: float = 30.0

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        from confluent_kafka import TopicPartition

        with open_consumer(self.kafka_config, "failover-reader") as consumer:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self.timeout_s
            )
        return int(low), int(high)

    def topic_id(self, topic: str) -> str:
        return self.describe(topic)[0]

    def describe(self, topic: str) -> tuple[str, list[int]]:
        """The topic's id and its partitions now."""
        from confluent_kafka import KafkaException, TopicCollection
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(client_properties(self.kafka_config, "admin"))
        try:
            found = admin.describe_topics(TopicCollection([topic]))[topic].result(self.timeout_s)
        except KafkaException as exc:
            raise FailoverRefusedError(f"replica topic {topic!r}: {exc.args[0]}") from exc
        return str(found.topic_id), sorted(int(p.id) for p in found.partitions)

    def read(self, topic: str, partition: int, start: int, count: int) -> tuple[Records, int]:
        """Up to ``count`` records from ``start`` as (offset, RecordId with a digest of the
        value and headers), and the end offset. One consumer asks the ends and reads; the read
        stops at ``count`` records (or the end), never waiting for more."""
        from confluent_kafka import TopicPartition

        found: Records = []
        with open_consumer(self.kafka_config, "failover-reader") as consumer:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self.timeout_s
            )
            if start < low:
                raise FailoverRefusedError(
                    f"{topic}[{partition}]: replica offset {start} is below the log start {low} "
                    "(retention deleted it): the alignment cannot be verified; nothing was changed"
                )
            if count <= 0 or start >= high:
                return found, int(high)
            rng = OffsetRange(topic, partition, start, int(high))
            where = f"replica {topic}"
            for batch in iter_batches(consumer, rng, self.timeout_s, where, limit=count):
                found.extend((int(m.offset() or 0), _identity(m)) for m in batch)
                if len(found) >= count:
                    break
        return found[:count], int(high)

    def last_record_before(
        self, topic: str, partition: int, offset: int
    ) -> tuple[int, RecordId] | None:
        """The replica's last record below ``offset`` (offsets may be markers or compacted
        away: scan back in growing windows); None when there is none."""
        low, _ = self.watermarks(topic, partition)
        span = 16
        while True:
            start = max(low, offset - span)
            if start >= offset:
                return None
            found, _ = self.read(topic, partition, start, offset - start)
            below = [item for item in found if item[0] < offset]
            if below:
                return below[-1]
            if start == low:
                return None
            span *= 4


def _identity(message: Any) -> RecordId:
    digest = digest_record(message.value(), message.headers())
    return RecordId(int(message.timestamp()[1]), message.key(), digest)


def read_offset_syncs(
    source_config: dict[str, Any], topic: str, timeout_s: float
) -> dict[tuple[str, int], list[OffsetSync]]:
    """Every offset sync in ``topic`` on the source, per source partition; {} if unreadable."""
    from confluent_kafka import KafkaException, TopicPartition

    syncs: dict[tuple[str, int], list[OffsetSync]] = {}
    try:
        with open_consumer(source_config, "failover-syncs-reader") as consumer:
            if topic not in consumer.list_topics(timeout=timeout_s).topics:
                return {}
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout_s)
            for message in iter_range(consumer, OffsetRange(topic, 0, low, high), timeout_s, topic):
                key, value = message.key(), message.value()
                if key is not None and value is not None:
                    sync = decode_offset_sync(key, value)
                    syncs.setdefault((sync.topic, sync.partition), []).append(sync)
    except KafkaException:
        return {}  # the source is down: fall back to checkpoints
    return syncs


def cluster_answers(kafka_config: dict[str, Any], timeout_s: float = 10.0) -> bool:
    """Whether the cluster answers a metadata request within ``timeout_s``."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient(client_properties(kafka_config, "admin")).list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return True
