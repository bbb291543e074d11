"""The late-copy guard's entries for the origin records a ``--source-lost`` failback reads
(R55): per origin partition with a tail and a reverse copy on the route, the tail's records read
on the primary (offset, timestamp, key digest), filed under the reverse copy's partition; a
primary that cannot be read refuses the failback. Hand-made origin topics on the session broker."""

from __future__ import annotations

import logging

import pytest

from ingestion.dr.align import key_digest
from ingestion.dr.failback.origin import OriginPlan
from ingestion.dr.failover import PartitionPlan
from ingestion.dr.late_copies.guard import Uncopied
from ingestion.dr.late_copies.origin import origin_entries
from ingestion.dr.replica_reader import Replica
from ingestion.exceptions import FailoverRefusedError
from resources.kafka import KafkaResource
from tests.support.pipelines import CreateTopic

T = 1_790_000_000_000


def line(topic: str, resume: int, tail: int, replica_topic: str = "primary.o") -> OriginPlan:
    """An origin partition the failback resumes at ``resume`` with ``tail`` records to read."""
    return OriginPlan(topic, 0, "id", 2, resume, 0, tail, replica_topic, 0, 0, 0)


# The replica partition the failback leaves (primary.o[0]) and its reverse copy (dr.o[0]).
PLANS = [PartitionPlan("primary.o", 0, 5, "dr.o", "id", 5, 0, "")]


@pytest.fixture
def origin(kafka: KafkaResource, create_topic: CreateTopic) -> str:
    """An origin topic holding 6 records (k0..k5 at T..T+5)."""
    topic = create_topic(partitions=1)
    producer = kafka.get_producer(logger=logging.getLogger("tests.late_origin"))
    for i in range(6):
        producer.produce(topic, b"v", b"k%d" % i, partition=0, timestamp=T + i)
        assert producer.flush(10) == 0  # one record per batch: Tansu's end offsets are exact
    return topic


@pytest.mark.integration
def test_the_tail_a_failback_reads_is_filed_under_the_reverse_copy(
    kafka: KafkaResource, origin: str
) -> None:
    entries = origin_entries(Replica(kafka.client_config(), 5.0), [line(origin, 3, 2)], PLANS, "p")
    assert entries == [
        (
            ("dr.o", 0),
            Uncopied(
                "primary",
                origin,
                (
                    (3, T + 3, key_digest(b"k3")),
                    (4, T + 4, key_digest(b"k4")),
                ),
            ),
        ),
    ]


@pytest.mark.integration
def test_no_tail_or_no_reverse_copy_on_the_route_needs_no_entry(
    kafka: KafkaResource, origin: str
) -> None:
    lines = [line(origin, 6, 0), line(origin, 3, 2, replica_topic="elsewhere.o")]
    assert origin_entries(Replica(kafka.client_config(), 5.0), lines, PLANS, "p") == []


def test_a_primary_that_cannot_be_read_refuses_the_failback() -> None:
    origin = "o"
    nowhere = Replica(
        {"bootstrap.servers": "127.0.0.1:1", "logger": logging.getLogger("nowhere")}, 1.0
    )
    with pytest.raises(
        FailoverRefusedError,
        match=f"origin {origin}\\[0\\] on the primary cannot be read from offset 3",
    ):
        origin_entries(nowhere, [line(origin, 3, 2)], PLANS, "p")
