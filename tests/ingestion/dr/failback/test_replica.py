"""Before a failback's completion: has MM2's reverse flow copied everything the replica holds?
Each drained reverse copy's last record below the table's position must be a byte-for-byte copy
of the last record of the replica topic it copies; refused when it is not or the replica does not
answer, unless the failback recorded that replica lost (then a note). The failback's switch is a
real Iceberg snapshot; both "clusters" are topics on the session broker."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField

from ingestion.dr.failback.lost import FAILOVER_SOURCE_LOST
from ingestion.dr.failback.origin import FAILOVER_PLAN
from ingestion.dr.failback.replica import check_replica_copied
from ingestion.dr.replica_reader import Replica
from ingestion.exceptions import FailoverRefusedError
from ingestion.table.offsets import (
    CLUSTER_ID,
    FAILOVER_TO,
    GROUP_ID,
    OFFSETS_PREFIX,
    TopicOffsets,
    encode_offsets,
)
from resources.kafka import KafkaResource
from tests.support.pipelines import CreateTopic

pytestmark = pytest.mark.integration

GROUP = "g"
NOWHERE = Replica({"bootstrap.servers": "127.0.0.1:1", "logger": logging.getLogger("nowhere")}, 1.0)


def failed_back(tmp_path: Path, source: str, copy: str, lost: str | None = None) -> Table:
    """A table whose route is a failback to the primary reading ``copy`` (the reverse copy of
    the replica's ``source``, partition 0), the replica recorded lost or not."""
    tmp_path.mkdir(exist_ok=True)
    catalog = SqlCatalog(
        "f", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/warehouse"
    )
    catalog.create_namespace("n")
    table = catalog.create_table("n.t", Schema(NestedField(1, "x", LongType(), required=False)))
    plan = [{"replica_topic": copy, "partition": 0, "source_topic": source}]
    switch = {
        GROUP_ID: GROUP,
        CLUSTER_ID: "pri",
        FAILOVER_TO: "primary",
        OFFSETS_PREFIX + GROUP: encode_offsets({copy: TopicOffsets("id", {0: 0})}),
        FAILOVER_PLAN: orjson.dumps(plan).decode(),
        **({FAILOVER_SOURCE_LOST: orjson.dumps({"lost": lost}).decode()} if lost else {}),
    }
    with (
        table.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties=switch).fast_append(),
    ):
        pass
    return table


def topic_of(
    kafka: KafkaResource, create_topic: CreateTopic, records: list[tuple[bytes, bytes]]
) -> str:
    """A one-partition topic holding ``records`` (key, value), stamped 1, 2, ..."""
    topic = create_topic(partitions=1)
    producer = kafka.get_producer(logger=logging.getLogger("tests.replica"))
    for stamp, (key, value) in enumerate(records, start=1):
        producer.produce(topic, value, key, partition=0, timestamp=1_790_000_000_000 + stamp)
        assert producer.flush(10) == 0  # one record per batch: Tansu's end offsets are exact
    return topic


ABC = [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]


def test_a_reverse_copy_that_reached_the_replicas_last_record_passes(
    tmp_path: Path, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    source, copy = topic_of(kafka, create_topic, ABC), topic_of(kafka, create_topic, ABC)
    table = failed_back(tmp_path, source, copy)
    here = Replica(kafka.client_config(), 5.0)
    assert check_replica_copied(table, GROUP, {(copy, 0): 3}, {"dr": here}, here, "p") == []
    # A partition not drained is not checked: the table has not read it to its end.
    uncopied = topic_of(kafka, create_topic, [*ABC, (b"d", b"4")])
    table = failed_back(tmp_path / "other", uncopied, copy)
    assert check_replica_copied(table, GROUP, {(copy, 1): 3}, {"dr": here}, here, "p") == []


def test_records_the_reverse_flow_has_not_copied_refuse_the_completion(
    tmp_path: Path, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    source = topic_of(kafka, create_topic, [*ABC, (b"d", b"4")])
    copy = topic_of(kafka, create_topic, ABC)
    table = failed_back(tmp_path, source, copy)
    here = Replica(kafka.client_config(), 5.0)
    with pytest.raises(FailoverRefusedError, match="holds records up to offset 3 that MM2's"):
        check_replica_copied(table, GROUP, {(copy, 0): 3}, {"dr": here}, here, "p")
    # The same last record with another value is no copy either.
    other = topic_of(kafka, create_topic, [*ABC[:2], (b"c", b"changed")])
    table = failed_back(tmp_path / "other", other, copy)
    with pytest.raises(FailoverRefusedError, match="has not copied"):
        check_replica_copied(table, GROUP, {(copy, 0): 3}, {"dr": here}, here, "p")


def test_a_replica_that_does_not_answer_refuses_unless_recorded_lost(
    tmp_path: Path, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    copy = topic_of(kafka, create_topic, ABC)
    here = Replica(kafka.client_config(), 5.0)
    table = failed_back(tmp_path, "primary.orders", copy)
    with pytest.raises(FailoverRefusedError, match="replica 'dr' does not answer"):
        check_replica_copied(table, GROUP, {(copy, 0): 3}, {"dr": NOWHERE}, here, "p")
    lost = failed_back(tmp_path / "lost", "primary.orders", copy, lost="dr")
    (note,) = check_replica_copied(lost, GROUP, {(copy, 0): 3}, {"dr": NOWHERE}, here, "p")
    assert note.startswith("note: replica 'dr' does not answer; the failback recorded it lost")
