"""The replica readiness check on two real brokers, with real MirrorMaker 2 (dedicated mode)
between them: every state here is one MM2 is driven into, no stand-in."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ingestion.dr.replica_check import ReplicaTarget, check_replica, read_replica_facts
from resources.embedded import EmbeddedBroker
from tests.support.mirror_maker import MirrorMaker

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
    tmp_path: Path,
) -> Iterator[Callable[..., tuple[MirrorMaker, Check]]]:
    """A topic with records, MM2 mirroring it under a fresh source alias (started, its copy
    made), and the check on them. ``checkpoints``: (partitions, config) of a checkpoints topic
    created before MM2 starts (MM2 then uses it as it is, as it would in a deployment)."""
    running: list[MirrorMaker] = []

    def _make(
        policy: str = "default", checkpoints: tuple[int, dict[str, str]] | None = None
    ) -> tuple[MirrorMaker, Check]:
        topic = create_topic(partitions=3)
        produce(broker.bootstrap_servers, topic, 30, 3)
        alias = f"src{abs(hash(request.node.nodeid)) % 10**8}"
        clusters = {alias: broker.bootstrap_servers, "dr": replica_broker.bootstrap_servers}
        mirror = MirrorMaker(tmp_path / "mm2.log", clusters, alias, "dr", [topic], [GROUP])
        if checkpoints is not None:
            mirror.create_checkpoints_topic(*checkpoints)
        running.append(mirror.start())
        mirror.wait_mirrored(topic)
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

    yield _make
    for mirror in running:
        mirror.stop()


def test_a_group_that_never_committed_gets_no_checkpoints_and_the_check_says_why(
    mirrored: Callable[..., tuple[MirrorMaker, Check]],
) -> None:
    mirror, check = mirrored()  # records copied, offset syncs written, no group offsets
    message = check()
    assert "has no committed offsets on the source cluster" in message
    assert "emits no checkpoints" in message
    topic = mirror.topics[0]
    commit_group(mirror.source, topic, {0: 4, 1: 7, 2: 10})
    for partition, offset in {0: 4, 1: 7, 2: 10}.items():
        mirror.wait_checkpoint(GROUP, topic, partition, offset)  # MM2 refreshes its groups
    assert check() == "passed"


@pytest.mark.parametrize(
    ("checkpoints", "fix"),
    [
        ((3, {"cleanup.policy": "compact"}), "has 3 partitions; MM2 needs exactly 1"),
        ((1, {"cleanup.policy": "delete"}), "set cleanup.policy=compact"),
    ],
)
def test_a_checkpoints_topic_of_the_wrong_shape_fails_the_check(
    mirrored: Callable[..., tuple[MirrorMaker, Check]],
    checkpoints: tuple[int, dict[str, str]],
    fix: str,
) -> None:
    # Created by hand before MM2 started: MM2 writes its checkpoints into it (partition 0) as
    # it finds it and never alters it, so only the check catches the shape.
    mirror, check = mirrored(checkpoints=checkpoints)
    commit_group(mirror.source, mirror.topics[0], {0: 3})
    mirror.wait_checkpoint(GROUP, mirror.topics[0], 0, 3)
    assert fix in check()


def test_a_stale_checkpoint_fails_the_check(
    mirrored: Callable[..., tuple[MirrorMaker, Check]],
) -> None:
    mirror, check = mirrored()
    commit_group(mirror.source, mirror.topics[0], {0: 3})
    mirror.wait_checkpoint(GROUP, mirror.topics[0], 0, 3)
    assert check() == "passed"
    later = int(time.time() * 1000) + 3_600_000  # an hour without a new checkpoint
    assert "the checkpoint connector is stopped or lagging" in check(now_ms=later)


def test_a_replication_policy_that_does_not_match_mm2s_fails_the_check(
    mirrored: Callable[..., tuple[MirrorMaker, Check]],
) -> None:
    # MM2 names copies '<alias>.<topic>'; a pipeline that says 'identity' looks for '<topic>'.
    mirror, check = mirrored(policy="identity")
    commit_group(mirror.source, mirror.topics[0], {0: 3})
    mirror.wait_checkpoint(GROUP, mirror.topics[0], 0, 3)
    assert f"topic {mirror.topics[0]!r} has no copy {mirror.topics[0]!r}" in check()
