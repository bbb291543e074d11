"""The replica readiness check on two real brokers, with real MirrorMaker 2 (dedicated mode, the
session's shared process) between them: every state here is one MM2 is driven into, no stand-in."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ingestion.dr.replica_check import ReplicaTarget, check_replica, read_replica_facts
from tests.support.mirror_maker import Flow, MirrorMaker

pytestmark = pytest.mark.integration


def commit_group(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """What the platform's offset mirror does after a commit: store the group's offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = [TopicPartition(topic, p, o) for p, o in offsets.items()]
        consumer.commit(offsets=tps, asynchronous=False)
    finally:
        consumer.close()


def produce(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(topic, value=b"{}", key=str(i).encode(), partition=i % partitions)
    producer.flush(10)


Check = Callable[..., str]
LANE = {None: "mm", 3: "mmcp3", 1: "mmcpdel"}  # checkpoints topic partitions -> its lane


@pytest.fixture
def mirrored(
    shared_mm2: MirrorMaker,
    create_topic: Callable[..., str],
    request: pytest.FixtureRequest,
) -> Callable[..., tuple[Flow, str, Check]]:
    """A topic with records that the session's MM2 mirrors (its copy made), a group of the
    test's own, and the check on them. ``checkpoints``: the number of partitions of the wrong
    checkpoints topic the lane's MM2 flow found when it started (3: compacted; 1: not
    compacted; ``tests.support.mirror_maker.LANES``), which MM2 then uses as it is."""

    def _make(policy: str = "default", checkpoints: int | None = None) -> tuple[Flow, str, Check]:
        lane = shared_mm2.lane(LANE[checkpoints])
        base = f"{lane.source_alias}-{abs(hash(request.node.nodeid)) % 10**8}"
        topic = create_topic(partitions=3, name=base)
        group = f"{base}-group"
        produce(lane.source, topic, 30, 3)
        mirror = lane.narrowed([topic], [group])
        mirror.wait_mirrored(topic)
        replica = {"bootstrap.servers": mirror.target}
        target = ReplicaTarget("dr", replica, mirror.source_alias, policy)  # type: ignore[arg-type]

        def check(now_ms: int | None = None, max_age_s: float = 300) -> str:
            facts = read_replica_facts(
                {"bootstrap.servers": mirror.source},
                target,
                group,
                [topic],
                now_ms or int(time.time() * 1000),
            )
            finding = check_replica(facts, max_age_s)
            return "passed" if finding.passed else finding.message

        return mirror, group, check

    return _make


Mirrored = Callable[..., tuple[Flow, str, Check]]


def test_a_group_that_never_committed_gets_no_checkpoints_and_the_check_says_why(
    mirrored: Mirrored,
) -> None:
    mirror, group, check = mirrored()  # records copied, offset syncs written, no group offsets
    message = check()
    assert "has no committed offsets on the source cluster" in message
    assert "emits no checkpoints" in message
    topic = mirror.topics[0]
    commit_group(mirror.source, group, topic, {0: 4, 1: 7, 2: 10})
    for partition, offset in {0: 4, 1: 7, 2: 10}.items():
        mirror.wait_checkpoint(group, topic, partition, offset)  # MM2 refreshes its groups
    assert check() == "passed"


@pytest.mark.parametrize(
    ("checkpoints", "fix"),
    [(3, "has 3 partitions; MM2 needs exactly 1"), (1, "set cleanup.policy=compact")],
)
def test_a_checkpoints_topic_of_the_wrong_shape_fails_the_check(
    mirrored: Mirrored, checkpoints: int, fix: str
) -> None:
    # Created by hand before MM2 started: MM2 writes its checkpoints into it (partition 0) as
    # it finds it and never alters it, so only the check catches the shape.
    mirror, group, check = mirrored(checkpoints=checkpoints)
    commit_group(mirror.source, group, mirror.topics[0], {0: 3})
    mirror.wait_checkpoint(group, mirror.topics[0], 0, 3)
    assert fix in check()


def test_a_stale_checkpoint_fails_the_check(mirrored: Mirrored) -> None:
    mirror, group, check = mirrored()
    commit_group(mirror.source, group, mirror.topics[0], {0: 3})
    mirror.wait_checkpoint(group, mirror.topics[0], 0, 3)
    assert check() == "passed"
    later = int(time.time() * 1000) + 3_600_000  # an hour without a new checkpoint
    assert "the checkpoint connector is stopped or lagging" in check(now_ms=later)


def test_a_replication_policy_that_does_not_match_mm2s_fails_the_check(
    mirrored: Mirrored,
) -> None:
    # MM2 names copies '<alias>.<topic>'; a pipeline that says 'identity' looks for '<topic>'.
    mirror, group, check = mirrored(policy="identity")
    commit_group(mirror.source, group, mirror.topics[0], {0: 3})
    mirror.wait_checkpoint(group, mirror.topics[0], 0, 3)
    assert f"topic {mirror.topics[0]!r} has no copy {mirror.topics[0]!r}" in check()
