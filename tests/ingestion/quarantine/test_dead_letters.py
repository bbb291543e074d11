"""The dead-letter topic's parts on their own: which commits still owe their copies (those with
quarantined records whose offsets are ahead of the group mirror, on a real SQL catalog), and the
copies themselves with Kafka Connect's context headers, counted back by commit id (the session
broker). The copy as a run makes it, crash and repeat included, is in test_bad_input.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table

from ingestion.quarantine.dead_letters import (
    COMMIT_HEADER,
    PendingCopy,
    count_copies,
    publish_dead_letters,
    unpublished_commits,
)
from ingestion.table.offsets import TopicOffsets, commit_properties
from ingestion.table.schema import load_or_create_quarantine_table, load_or_create_table
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.pipelines import CreateTopic, make_spec

SPEC = make_spec("orders", "dead", errors_tolerance="all")
GROUP = SPEC.consumer_group_id


def commit(table: Table, next_offsets: dict[int, int], quarantined: int, commit_id: str) -> int:
    """An empty commit of the group's offsets (``orders`` partition -> next) that set
    ``quarantined`` records aside; return its commit time."""
    properties = commit_properties(
        group_id=GROUP, offsets={"orders": TopicOffsets("id", next_offsets)},
        commit_id=commit_id, cluster_id="k", pipeline=SPEC.name, quarantined=quarantined,
    )  # fmt: skip
    with (
        table.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties=properties).fast_append(),
    ):
        pass
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return snapshot.timestamp_ms


@pytest.fixture
def table(tmp_path: Path) -> Table:
    return load_or_create_table(
        IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog(), SPEC
    )


def test_commits_with_dead_letters_ahead_of_the_mirror_are_pending_newest_first(
    table: Table,
) -> None:
    commit(table, {0: 10, 1: 4}, 1, "c1")
    commit(table, {0: 20, 1: 4}, 0, "c2")  # no dead letter: nothing to copy
    at3 = commit(table, {0: 30, 1: 6}, 2, "c3")
    at4 = commit(table, {0: 40, 1: 6}, 3, "c4")
    # The mirror reached c2 on every partition: c1 and older were copied.
    pending = unpublished_commits(table, GROUP, {("orders", 0): 20, ("orders", 1): 4})
    assert pending == [PendingCopy("c4", at4, 3), PendingCopy("c3", at3, 2)]
    # A partition the mirror lacks holds everything back.
    assert [p.commit_id for p in unpublished_commits(table, GROUP, {("orders", 0): 40})] == [
        "c4", "c3", "c1",
    ]  # fmt: skip
    assert unpublished_commits(table, GROUP, {("orders", 0): 40, ("orders", 1): 6}) == []


def test_nothing_pending_reads_and_sends_nothing(table: Table) -> None:
    """No Kafka client is even created: the settings point nowhere."""
    nowhere = {"bootstrap.servers": "nowhere:1"}
    assert count_copies(nowhere, "dlq", [], "p") == {}
    assert publish_dead_letters(nowhere, "dlq", table, []) == 0


@pytest.mark.integration
def test_the_copies_carry_connects_headers_and_are_counted_back_by_commit_id(
    tmp_path: Path, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    quarantine = load_or_create_quarantine_table(catalog, SPEC)
    rows = [
        {"_kafka_topic": "orders", "_kafka_partition": p, "_kafka_offset": o,
         "_kafka_key": b"k", "value": b"{oops", "error_class": "ArrowInvalid",
         "error_message": "not JSON", "pipeline": SPEC.name, "commit_id": c}
        for p, o, c in [(0, 5, "c1"), (1, 7, "c1"), (0, 9, "c2"), (0, 12, "c3")]
    ]  # fmt: skip
    quarantine.append(pa.Table.from_pylist(rows, schema=schema_to_pyarrow(quarantine.schema())))
    dead = create_topic(partitions=2)
    config = kafka.client_config()

    assert publish_dead_letters(config, dead, quarantine, ["c1", "c2"]) == 3

    pending = [PendingCopy(c, 0, 1) for c in ("c1", "c2", "c3")]
    assert count_copies(config, dead, pending, SPEC.name, idle_s=0.5) == {
        "c1": 2, "c2": 1, "c3": 0,
    }  # fmt: skip
    consumer = kafka.get_consumer()
    try:
        consumer.assign([TopicPartition(dead, p, 0) for p in (0, 1)])
        messages = consumer.consume(3, timeout=5)
    finally:
        consumer.close()
    headers = sorted(
        (dict(m.headers() or [])["__connect.errors.offset"], dict(m.headers() or []))
        for m in messages
    )
    assert [offset for offset, _ in headers] == [b"5", b"7", b"9"]
    first = headers[0][1]
    assert first == {
        "__connect.errors.topic": b"orders",
        "__connect.errors.partition": b"0",
        "__connect.errors.offset": b"5",
        "__connect.errors.exception.class.name": b"ArrowInvalid",
        "__connect.errors.exception.message": b"not JSON",
        COMMIT_HEADER: b"c1",
    }
    assert {m.value() for m in messages} == {b"{oops"}
    assert {m.key() for m in messages} == {b"k"}
