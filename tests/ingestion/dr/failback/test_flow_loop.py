"""After a failback, records of an origin topic coming back through its reverse copy: which
(origin, reverse copy) pairs a failback in force reads and where the route started on each (real
Iceberg snapshots), and the copies found byte for byte among the newest reverse-copy records,
past both starts (hand-made topics on the session broker)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import orjson
import pytest

from ingestion.dr.failback.flow_loop import (
    FailbackFlows,
    LoopedRecord,
    failback_flows,
    find_looped_records,
)
from ingestion.table.offsets import (
    FAILOVER_TO,
)
from ingestion.table.route import FAILOVER_ORIGIN, FAILOVER_TOPICS
from resources.kafka import KafkaResource
from tests.support.history import group_commit, table_with_history
from tests.support.pipelines import CreateTopic

GROUP = "g"


def failback(names: dict[str, str], origins: list[str], at: dict[str, int]) -> dict[str, str]:
    """A failback switch reading ``origins`` again next to the reverse copies ``names``."""
    origin = orjson.dumps([{"topic": t, "partition": 0} for t in origins]).decode()
    switch = {FAILOVER_TOPICS: orjson.dumps(names).decode(), FAILOVER_ORIGIN: origin}
    return group_commit(GROUP, "pri", at, **{FAILOVER_TO: "primary", **switch})


def test_a_failback_in_force_pairs_each_origin_with_its_reverse_copy(tmp_path: Path) -> None:
    back = failback({"o": "dr.o", "p": "dr.p"}, ["o"], {"o": 12, "dr.o": 4, "dr.p": 7})
    table = table_with_history(tmp_path, group_commit(GROUP, "pri", {"o": 10}), back)
    flows = failback_flows(table, GROUP)
    assert flows == FailbackFlows([("o", "dr.o")], {("o", 0): 12, ("dr.o", 0): 4, ("dr.p", 0): 7})


@pytest.mark.parametrize(
    "commits",
    [
        [group_commit(GROUP, "pri", {"o": 10})],  # no route
        [
            group_commit(GROUP, "pri", {"o": 10}),
            group_commit(GROUP, "dr", {"primary.o": 3}, **{FAILOVER_TO: "dr"}),
        ],
        # identity naming both ways: the reverse copy is the origin topic itself
        [group_commit(GROUP, "pri", {"o": 10}), failback({"o": "o"}, ["o"], {"o": 12})],
    ],
    ids=["no-route", "failover-to-replica", "identity-both-ways"],
)
def test_no_failback_to_check(tmp_path: Path, commits: list[dict[str, str]]) -> None:
    assert failback_flows(table_with_history(tmp_path, *commits), GROUP) is None


@pytest.mark.integration
def test_copies_of_origin_records_past_the_failback_are_found_and_others_not(
    kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    origin, copy = create_topic(partitions=1), create_topic(partitions=1)
    # librdkafka logs through Python logging: no reconnect noise once the broker stops.
    producer = kafka.get_producer(logger=logging.getLogger("tests.flow_loop"))
    t0 = int(time.time() * 1000) - 60_000

    def send(topic: str, ms: int, key: bytes, value: bytes, headers: list | None = None) -> None:
        producer.produce(topic, value, key, partition=0, timestamp=ms, headers=headers)
        assert producer.flush(10) == 0  # one record per batch: Tansu's end offsets are exact

    for i in range(3):  # origin offsets 0..2: before the failback (origin start 2)
        send(origin, t0 + i, b"k%d" % i, b"v%d" % i)
    for i in range(3, 6):  # origin offsets 3..5: after it
        send(origin, t0 + i, b"k%d" % i, b"v%d" % i, [("h", b"1")])
    send(copy, t0 - 100, b"x", b"before the copy's start")  # copy offset 0, before its start
    send(copy, t0 + 1, b"k1", b"v1")  # offset 1: a pending copy (origin offset 1 < its start)
    send(copy, t0 + 4, b"k4", b"v4", [("h", b"1")])  # offset 2: a loop (origin offset 4)
    send(copy, t0 + 5, b"k5", b"v5")  # offset 3: headers differ: another record
    send(copy, t0 + 3, b"k3", b"v3", [("h", b"1")])  # offset 4: a loop (origin offset 3)
    flows = FailbackFlows([(origin, copy)], {(origin, 0): 2, (copy, 0): 1})
    assert find_looped_records(kafka.client_config(), flows) == [
        LoopedRecord(copy, 0, 2, origin, 4),
        LoopedRecord(copy, 0, 4, origin, 3),
    ]
    clean = FailbackFlows([(origin, copy)], {(origin, 0): 6, (copy, 0): 1})
    assert find_looped_records(kafka.client_config(), clean) == []
