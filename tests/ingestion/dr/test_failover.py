"""Planning a failover to an MM2 replica on real brokers and a real table: where each partition
resumes is the copy of the first record the table has not ingested, from an offset sync or from
a conservative checkpoint alone (the source down), and a replica behind the table is refused.
Real MirrorMaker 2 (dedicated mode) mirrors, but for two states (each test says why)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ingestion.dr.failover import plan_failover
from ingestion.dr.replica_check import ReplicaTarget, read_checkpoints
from ingestion.dr.replica_reader import read_offset_syncs
from ingestion.exceptions import FailoverRefusedError
from ingestion.pipeline.run import run_pipeline
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import find_committed_state
from resources.embedded import EmbeddedBroker
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.ledger import LedgerProducer
from tests.support.mirror_maker import Flow, MirrorMaker
from tests.support.mm2_standin import MirrorStandIn
from tests.support.pipelines import make_spec, records

pytestmark = pytest.mark.integration
JUNK = 5  # records already in each replica partition: replica offsets differ from the source's


Mirror = Flow | MirrorStandIn


@pytest.fixture
def real_mm2(
    shared_mm2: MirrorMaker,
    create_topic: Any,
    ledger_producer: LedgerProducer,
    request: pytest.FixtureRequest,
) -> Any:
    """``real_mm2(name, partitions, produce)``: a topic the session's MM2 mirrors on its lane
    with an offset sync every 8 records (``mmlag``: ``offset.lag.max=7``, so MM2's translation
    is conservative), ``produce`` records in it, and a pipeline ``name`` on it, whose group MM2
    checkpoints; JUNK records are in each partition of its copy before the topic exists (MM2
    appends to a copy it finds: replica offsets differ from the source's). Returns
    (mirror, topic, spec)."""

    def start(name: str, partitions: int, produce: int, **overrides: Any) -> Any:
        lane = shared_mm2.lane("mmlag")
        topic = f"{lane.source_alias}-{abs(hash(request.node.nodeid)) % 10**8}"
        add_junk(lane.target, lane.remote(topic), partitions)
        create_topic(partitions=partitions, name=topic)
        spec = make_spec(topic, name, consumer_group_id=f"{topic}-group", **overrides)
        ledger_producer.produce(topic, records(produce))
        return lane.narrowed([topic], [spec.consumer_group_id]), topic, spec

    return start


def add_junk(replica: str, copy: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": replica})
    admin.create_topics([NewTopic(copy, partitions, 1)])[copy].result(10)
    junk = Producer({"bootstrap.servers": replica})
    for partition in range(partitions):
        for i in range(JUNK):
            junk.produce(copy, value=b"old", key=f"old{i}".encode(), partition=partition)
    junk.flush(10)


def start_mirror(
    broker: EmbeddedBroker, replica: EmbeddedBroker, topic: str, spec: PipelineSpec
) -> MirrorStandIn:
    mirror = MirrorStandIn(
        broker.bootstrap_servers,
        replica.bootstrap_servers,
        [topic],
        [spec.consumer_group_id],
        source_alias=f"a{spec.name}",
        sync_every=7,
    ).setup()
    junk = Producer({"bootstrap.servers": replica.bootstrap_servers})
    for partition in (0, 1):
        for i in range(JUNK):
            junk.produce(
                mirror.remote(topic), value=b"old", key=f"old{i}".encode(), partition=partition
            )
    junk.flush(10)
    return mirror


def plan(
    mirror: Mirror,
    spec: PipelineSpec,
    catalog: Any,
    with_syncs: bool,
    source_down: bool = False,
    uncopied: dict[int, int] | None = None,
) -> dict[int, int]:
    committed = find_committed_state(catalog.load_table(spec.table), spec.consumer_group_id)
    assert committed is not None
    offsets = {
        (topic, p): n for topic, o in committed.offsets.items() for p, n in o.next_offsets.items()
    }
    replica = {"bootstrap.servers": mirror.target}
    target = ReplicaTarget("dr", replica, mirror.source_alias)
    checkpoints = read_checkpoints(replica, mirror.checkpoints_topic)
    source = {"bootstrap.servers": mirror.source}
    syncs = read_offset_syncs(source, mirror.syncs_topic, 10) if with_syncs else {}
    topic = mirror.topics[0]
    plans = plan_failover(
        catalog,
        spec,
        offsets,
        target,
        checkpoints,
        syncs,
        {topic: mirror.remote(topic)},
        source_down=source_down,
    )
    for p in plans:
        assert p.anchor.startswith("offset sync" if with_syncs else "checkpoint"), p
    if uncopied is not None:
        assert {p.partition: p.uncopied for p in plans} == uncopied
    return {p.partition: p.replica_start for p in plans}


@pytest.mark.parametrize("with_syncs", [True, False], ids=["offset-syncs", "checkpoints-only"])
def test_a_failover_resumes_at_the_copy_of_the_first_record_not_ingested(
    real_mm2: Any,
    kafka: KafkaResource,
    catalog_resource: IcebergCatalogResource,
    ledger_producer: LedgerProducer,
    with_syncs: bool,
) -> None:
    name = f"fo_{'s' if with_syncs else 'c'}"
    mirror, topic, spec = real_mm2(name, 2, 60, errors_tolerance="all")
    catalog = catalog_resource.load_catalog()
    run_pipeline(spec, kafka.client_config(), catalog, None, kafka.get_cluster_id())
    ledger_producer.produce(
        topic, records(17, first=60)
    )  # not ingested: must come from the replica
    mirror.wait_mirrored(topic)  # all 77 copied
    committed = find_committed_state(catalog.load_table(spec.table), spec.consumer_group_id)
    assert committed is not None
    source_next = committed.offsets[topic].next_offsets
    for partition, offset in source_next.items():  # the group at the table's offsets
        mirror.wait_checkpoint(spec.consumer_group_id, topic, partition, offset)
    # MM2 copies partition for partition after JUNK records: the copy of source offset n sits
    # at JUNK + n. The syncs fall every 8 records, so MM2's translation is conservative.
    assert plan(mirror, spec, catalog, with_syncs) == {p: JUNK + n for p, n in source_next.items()}


def test_a_replica_behind_the_table_waits_for_mm2_unless_the_source_is_down(
    broker: EmbeddedBroker,
    replica_broker: EmbeddedBroker,
    kafka: KafkaResource,
    catalog_resource: IcebergCatalogResource,
    new_pipeline: Any,
    ledger_producer: LedgerProducer,
) -> None:
    # The stand-in: this state needs MM2's checkpoint connector to checkpoint a group that is
    # ahead of what its source connector copied. In dedicated mode both connectors run in one
    # worker with no REST API to pause one of them; stopping MM2 stops both, so real MM2
    # cannot be driven into it.
    topic, spec = new_pipeline("fo_behind", partitions=2, produce=40)
    catalog = catalog_resource.load_catalog()
    mirror = start_mirror(broker, replica_broker, topic, spec)
    mirror.replicate()  # the replica has the first 40
    ledger_producer.produce(topic, records(20, first=40))
    run_pipeline(spec, kafka.client_config(), catalog, None, kafka.get_cluster_id())
    mirror.checkpoint()  # the group is at 30 per partition; the replica holds 20 per partition
    with pytest.raises(FailoverRefusedError, match="the replica is behind the table"):
        plan(mirror, spec, catalog, with_syncs=False)  # the source answers: MM2 will catch up
    # The disaster: the source is down, MM2 copies nothing more. The copies end at the
    # replica's end; the 10 records per partition the table ingested without a copy stay
    # ingested once, and the replica's next records are read from there.
    replica = Consumer({"bootstrap.servers": replica_broker.bootstrap_servers, "group.id": "x"})
    copy = mirror.remote(topic)
    ends = {p: replica.get_watermark_offsets(TopicPartition(copy, p), 10)[1] for p in (0, 1)}
    replica.close()
    assert plan(mirror, spec, catalog, False, source_down=True, uncopied={0: 10, 1: 10}) == ends


def test_repeated_records_at_the_checkpoint_are_refused_not_guessed(
    broker: EmbeddedBroker,
    replica_broker: EmbeddedBroker,
    kafka: KafkaResource,
    catalog_resource: IcebergCatalogResource,
    new_pipeline: Any,
) -> None:
    # The stand-in: the state is an anchor among identical records from which several readings
    # resume at different offsets. On real MM2 (offset.lag.max=7) its sync fell so that every
    # reading resumed at the replica's end and the plan rightly placed the group there; at its
    # default (100) no checkpoint came within 90 s. The stand-in's sync every 7 records gives
    # the ambiguous anchor deterministically (docs/disaster-recovery.md, "Verified on real
    # MirrorMaker 2").
    # A producer retrying without idempotence writes one payload twice with the same timestamp
    # and key (R39); here every record looks alike, so no copy singles out one position.
    topic, spec = new_pipeline("fo_same", partitions=1, key_format="raw")
    same = Producer({"bootstrap.servers": broker.bootstrap_servers})
    # One recent millisecond: Kafka's retention (7 days, checked every second by the embedded
    # broker) would delete records stamped long ago.
    stamp = int(time.time() * 1000)
    for _ in range(30):
        same.produce(topic, value=b'{"id": 1}', key=b"same", timestamp=stamp)
        same.flush(10)
    catalog = catalog_resource.load_catalog()
    mirror = start_mirror(broker, replica_broker, topic, spec)
    run_pipeline(spec, kafka.client_config(), catalog, None, kafka.get_cluster_id())
    mirror.step()
    with pytest.raises(FailoverRefusedError, match="records repeat"):
        plan(mirror, spec, catalog, with_syncs=False)
