"""The replica readiness check on two real brokers, with a MirrorMaker 2 stand-in between them."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ingestion.dr.replica_check import ReplicaTarget, check_replica, read_replica_facts
from resources.embedded import EmbeddedBroker
from tests.support.mm2_standin import MirrorStandIn

pytestmark = pytest.mark.integration
GROUP = "platform-dr"


def commit_group(bootstrap: str, topic: str, offsets: dict[int, int]) -> None:
    """What the platform's offset mirror does after a commit: store the group's offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
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


@pytest.fixture
def mirrored(
    broker: EmbeddedBroker,
    replica_broker: EmbeddedBroker,
    create_topic: Callable[..., str],
    request: pytest.FixtureRequest,
) -> Callable[..., tuple[MirrorStandIn, Check]]:
    """A topic with records, a stand-in under a fresh source alias, and the check on them."""

    def _make(policy: str = "default", **standin: object) -> tuple[MirrorStandIn, Check]:
        topic = create_topic(partitions=3)
        produce(broker.bootstrap_servers, topic, 30, 3)
        alias = f"src{abs(hash(request.node.nodeid)) % 10**8}"
        mirror = MirrorStandIn(
            broker.bootstrap_servers,
            replica_broker.bootstrap_servers,
            [topic],
            [GROUP],
            source_alias=alias,
            **standin,  # type: ignore[arg-type]
        ).setup()
        replica = {"bootstrap.servers": replica_broker.bootstrap_servers}
        target = ReplicaTarget("dr", replica, alias, policy)  # type: ignore[arg-type]

        def check(now_ms: int | None = None, max_age_s: float = 300) -> str:
            facts = read_replica_facts(
                {"bootstrap.servers": broker.bootstrap_servers},
                target,
                GROUP,
                [topic],
                now_ms or int(time.time() * 1000),
            )
            finding = check_replica(facts, max_age_s)
            return "passed" if finding.passed else finding.message

        return mirror, check

    return _make


def test_a_group_that_never_committed_gets_no_checkpoints_and_the_check_says_why(
    mirrored: Callable[..., tuple[MirrorStandIn, Check]],
) -> None:
    mirror, check = mirrored()
    mirror.step()  # records copied, offset syncs written, but no group offsets: no checkpoints
    message = check()
    assert "has no committed offsets on the source cluster" in message
    assert "emits no checkpoints" in message
    commit_group(mirror.source, mirror.topics[0], {0: 4, 1: 7, 2: 10})
    mirror.step()
    assert check() == "passed"


@pytest.mark.parametrize(
    ("standin", "fix"),
    [
        ({"checkpoints_partitions": 3}, "has 3 partitions; MM2 needs exactly 1"),
        ({"checkpoints_config": {"cleanup.policy": "delete"}}, "set cleanup.policy=compact"),
    ],
)
def test_a_checkpoints_topic_of_the_wrong_shape_fails_the_check(
    mirrored: Callable[..., tuple[MirrorStandIn, Check]], standin: dict[str, object], fix: str
) -> None:
    mirror, check = mirrored(**standin)
    commit_group(mirror.source, mirror.topics[0], {0: 3})
    mirror.step()
    assert fix in check()


def test_a_stale_checkpoint_fails_the_check(
    mirrored: Callable[..., tuple[MirrorStandIn, Check]],
) -> None:
    mirror, check = mirrored()
    commit_group(mirror.source, mirror.topics[0], {0: 3})
    mirror.step()
    assert check() == "passed"
    later = int(time.time() * 1000) + 3_600_000  # an hour without a new checkpoint
    assert "the checkpoint connector is stopped or lagging" in check(now_ms=later)


def test_a_replication_policy_that_does_not_match_mm2s_fails_the_check(
    mirrored: Callable[..., tuple[MirrorStandIn, Check]],
) -> None:
    # MM2 names copies '<alias>.<topic>'; a pipeline that says 'identity' looks for '<topic>'.
    mirror, check = mirrored(policy="identity")
    commit_group(mirror.source, mirror.topics[0], {0: 3})
    mirror.step()
    assert f"topic {mirror.topics[0]!r} has no copy {mirror.topics[0]!r}" in check()
