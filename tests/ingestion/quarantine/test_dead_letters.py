"""The dead-letter topic's parts on their own: which commits still owe their copies (those with
quarantined records whose offsets are ahead of the group mirror, on a real SQL catalog), and the
copies themselves with Kafka Connect's context headers, counted back by commit id, and their
transactions: a failed copy and a killed copier leave nothing a read_committed consumer reads
(the session broker). The copy as a run makes it, crash and repeat included, is in
test_bad_input.py."""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table

from ingestion.quarantine.dead_letters import (
    COMMIT_HEADER,
    HEADERS,
    Coordinates,
    PendingCopy,
    copy_pending_dead_letters,
    count_copies,
    dead_letter_producer,
    publish_dead_letters,
    unpublished_commits,
)
from ingestion.table.offsets import FAILOVER_TO, TopicOffsets, commit_properties
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
        group_id=GROUP,
        offsets={"orders": TopicOffsets("id", next_offsets)},
        commit_id=commit_id,
        cluster_id="k",
        pipeline=SPEC.name,
        quarantined=quarantined,
    )
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
    ids = {"orders": "id"}
    assert pending == [PendingCopy("c4", at4, 3, "k", ids), PendingCopy("c3", at3, 2, "k", ids)]
    # A partition the mirror lacks holds everything back.
    assert [p.commit_id for p in unpublished_commits(table, GROUP, {("orders", 0): 40})] == [
        "c4",
        "c3",
        "c1",
    ]
    assert unpublished_commits(table, GROUP, {("orders", 0): 40, ("orders", 1): 6}) == []


def test_a_group_left_ahead_by_a_backward_reset_hides_no_re_read_commit(table: Table) -> None:
    """A backward reset whose move of the Kafka group failed leaves the group where it found
    it, ahead of the reset's offsets. The re-read commits' offsets are below it, so they looked
    copied: the letters of records read there for the first time (a forward reset had skipped
    them) were never sent, and the next mirror moved the group past them. A group still at the
    position the reset recorded replacing stands for the reset's offsets, also once the table
    has overtaken it (the review of the first fix, which looked at the newest commit only);
    a group ahead for another reason is taken as it is."""
    commit(table, {0: 40}, 1, "before")
    reset = commit_properties(
        group_id=GROUP,
        offsets={"orders": TopicOffsets("id", {0: 0})},
        commit_id="reset",
        cluster_id="k",
        pipeline=SPEC.name,
        requested_by="ops",
        reason="re-read",
        group_offsets_before={("orders", 0): 40},
    )
    with (
        table.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties=reset).fast_append(),
    ):
        pass
    commit(table, {0: 30}, 2, "re-read-1")
    commit(table, {0: 45}, 0, "re-read-2")  # past where the group was left

    pending = unpublished_commits(table, GROUP, {("orders", 0): 40})  # still where it was
    assert [p.commit_id for p in pending] == ["re-read-1"]
    assert unpublished_commits(table, GROUP, {("orders", 0): 45}) == []  # mirrored since
    assert unpublished_commits(table, GROUP, {("orders", 0): 50}) == []  # a foreign move


def test_the_search_stops_at_a_switch_to_another_cluster(table: Table) -> None:
    """Commits before a failover read the cluster it left (the switch copied their letters
    there first); the group on the new cluster lacks their topics, which made every one of
    them look owed, to be sent again to the new cluster's topic."""
    commit(table, {0: 10}, 1, "before")
    properties = commit_properties(
        group_id=GROUP,
        offsets={"west.orders": TopicOffsets("id2", {0: 8})},
        commit_id="switch",
        cluster_id="dr",
        pipeline=SPEC.name,
    )
    properties[FAILOVER_TO] = "dr"
    with (
        table.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties=properties).fast_append(),
    ):
        pass
    commit(table, {0: 12}, 2, "after")  # offsets of `orders` again: the group has none

    assert [p.commit_id for p in unpublished_commits(table, GROUP, {})] == ["after"]


def test_nothing_pending_reads_and_sends_nothing(table: Table) -> None:
    """No Kafka client is even created: the settings point nowhere."""
    nowhere = {"bootstrap.servers": "nowhere:1"}
    assert count_copies(nowhere, "dlq", [], "p") == {}
    assert publish_dead_letters(Producer(nowhere), "dlq", table, []) == 0  # never initialised


def test_a_copier_that_cannot_initialise_its_transactional_id_names_it() -> None:
    """R33: a copy whose transactional id cannot be initialised (its ACLs; here no broker
    answers InitProducerId at all, a port nothing listens on) failed with librdkafka's bare
    error, and the group check then blamed the topic. The error names the id and what the
    platform's principal needs on it."""
    from ingestion.exceptions import DeadLetterTopicError
    from resources.embedded import find_free_port

    nowhere = {"bootstrap.servers": f"127.0.0.1:{find_free_port()}", "log_level": 0}
    with pytest.raises(DeadLetterTopicError) as refused:
        dead_letter_producer(nowhere, "nobody", timeout_s=1)
    message = str(refused.value)
    assert "pipeline 'nobody'" in message
    assert "transactional id 'kafka-iceberg-nobody-dead-letters'" in message
    assert "needs Write and Describe on that transactional id" in message
    assert "nothing was sent" in message


@pytest.mark.integration
def test_the_copies_carry_connects_headers_and_are_counted_back_by_commit_id(
    tmp_path: Path, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    quarantine = load_or_create_quarantine_table(catalog, SPEC)
    rows = [
        {
            "_kafka_topic": "orders",
            "_kafka_partition": p,
            "_kafka_offset": o,
            "_kafka_key": b"k",
            "value": b"{oops",
            "error_class": "ArrowInvalid",
            "error_message": "not JSON",
            "pipeline": SPEC.name,
            "commit_id": c,
        }
        for p, o, c in [(0, 5, "c1"), (1, 7, "c1"), (0, 9, "c2"), (0, 12, "c3")]
    ]
    quarantine.append(pa.Table.from_pylist(rows, schema=schema_to_pyarrow(quarantine.schema())))
    dead = create_topic(partitions=2)
    config = kafka.client_config()

    producer = dead_letter_producer(config, SPEC.name)
    assert publish_dead_letters(producer, dead, quarantine, ["c1", "c2"]) == 3

    pending = [PendingCopy(c, 0, 1) for c in ("c1", "c2", "c3")]
    assert sizes(count_copies(config, dead, pending, SPEC.name)) == {
        "c1": 2,
        "c2": 1,
        "c3": 0,
    }
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


def sizes(found: dict[str, set[Coordinates]]) -> dict[str, int]:
    """How many distinct letters of each commit the count found."""
    return {commit: len(letters) for commit, letters in found.items()}


def letter_rows(
    quarantine: Table, rows: list[tuple[int, int, str, bytes]], key: Callable[[bytes], bytes]
) -> None:
    """Quarantine rows (partition, offset, commit id, value) of topic ``orders``, keyed."""
    table = [
        {
            "_kafka_topic": "orders",
            "_kafka_partition": p,
            "_kafka_offset": o,
            "_kafka_key": key(v),
            "value": v,
            "error_class": "ArrowInvalid",
            "error_message": "not JSON",
            "pipeline": SPEC.name,
            "commit_id": c,
        }
        for p, o, c, v in rows
    ]
    quarantine.append(pa.Table.from_pylist(table, schema=schema_to_pyarrow(quarantine.schema())))


def read_committed(kafka: KafkaResource, topic: str, partitions: int) -> list[bytes]:
    """Every value of ``topic`` a plain read_committed consumer reads, to the end."""
    consumer = kafka.get_consumer()  # read_committed (ingestion.kafka.consumer)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values: list[bytes] = []
        while batch := consumer.consume(100, timeout=3):
            values += [m.value() or b"" for m in batch if m.error() is None]
    finally:
        consumer.close()
    return sorted(values)


@pytest.mark.integration
def test_a_copy_the_broker_refuses_in_part_is_aborted_whole_and_retried_once(
    tmp_path: Path, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    """A letter larger than the topic's ``max.message.bytes`` fails the copy after the small
    ones were accepted: the transaction is aborted, so a read_committed consumer sees none of
    them and the count finds none; once the operator raises the limit, the retry sends each
    letter once (a non-transactional copy re-sent the small ones: a reader saw them twice)."""
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    quarantine = load_or_create_quarantine_table(catalog, SPEC)
    big = b"{" + b"x" * 20_000
    # librdkafka's default partitioner: CRC-32 of the key. The big letter alone on partition 1,
    # so the small ones' batch on partition 0 is accepted (a plain producer made them visible).
    keys = {b"{a": b"d", big: b"a", b"{b": b"d"}
    assert [zlib.crc32(k) % 2 for k in keys.values()] == [0, 1, 0]
    letter_rows(
        quarantine, [(0, 1, "c1", b"{a"), (0, 2, "c1", big), (1, 3, "c1", b"{b")], keys.__getitem__
    )
    dead = create_topic(partitions=2, **{"max.message.bytes": "10000"})
    config = kafka.client_config()
    pending = [PendingCopy("c1", 0, 3)]

    with pytest.raises(KafkaException, match=r"MSG_SIZE_TOO_LARGE|too large"):
        publish_dead_letters(dead_letter_producer(config, SPEC.name), dead, quarantine, ["c1"])
    assert sizes(count_copies(config, dead, pending, SPEC.name)) == {"c1": 0}
    assert read_committed(kafka, dead, 2) == []

    admin = kafka.get_admin_client()
    entry = ConfigEntry("max.message.bytes", "100000", incremental_operation=AlterConfigOpType.SET)
    raised = ConfigResource("topic", dead, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([raised]).values():
        future.result(10)
    producer = dead_letter_producer(config, SPEC.name)
    assert sizes(count_copies(config, dead, pending, SPEC.name)) == {"c1": 0}
    assert publish_dead_letters(producer, dead, quarantine, ["c1"]) == 3
    assert read_committed(kafka, dead, 2) == sorted([b"{a", big, b"{b"])
    assert sizes(count_copies(config, dead, pending, SPEC.name)) == {"c1": 3}


@pytest.mark.integration
def test_a_copier_killed_mid_copy_is_fenced_and_its_letters_never_read(
    tmp_path: Path, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    """A copier that produced its letters and died before its commit (its transaction left
    open): the next copier's initialisation aborts it, so the count is final and the letters
    are read once; the dead copier, had it come back, could not commit (fenced)."""
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    quarantine = load_or_create_quarantine_table(catalog, SPEC)
    letter_rows(quarantine, [(0, 1, "c9", b"{a"), (1, 2, "c9", b"{b")], lambda _: b"k")
    dead = create_topic(partitions=2)
    config = kafka.client_config()
    pending = [PendingCopy("c9", 0, 2)]

    killed = dead_letter_producer(config, SPEC.name)
    killed.begin_transaction()
    for value in (b"{a", b"{b"):
        killed.produce(dead, value=value, headers=[(COMMIT_HEADER, b"c9")])
    assert killed.flush(10) == 0  # written to the log, never committed

    producer = dead_letter_producer(config, SPEC.name)  # fences the killed one
    assert sizes(count_copies(config, dead, pending, SPEC.name)) == {"c9": 0}
    assert publish_dead_letters(producer, dead, quarantine, ["c9"]) == 2
    with pytest.raises(KafkaException):
        killed.commit_transaction(10)
    assert read_committed(kafka, dead, 2) == [b"{a", b"{b"]


def open_foreign_transaction(config: dict[str, str], topic: str) -> Producer:
    """Another producer with a transaction left open on ``topic`` (it holds the last stable
    offset until it commits or aborts)."""
    other = Producer({**config, "transactional.id": f"other-{topic}"})
    other.init_transactions(10)
    other.begin_transaction()
    other.produce(topic, value=b"someone else's")
    assert other.flush(10) == 0
    return other


def old_copy(config: dict[str, str], topic: str, commit: str, offsets: list[int]) -> None:
    """Letters as an at-least-once copy left them: plain producer, Kafka Connect's headers."""
    producer = Producer(config)
    for offset in offsets:
        headers = {
            HEADERS["_kafka_topic"]: b"orders",
            HEADERS["_kafka_partition"]: b"0",
            HEADERS["_kafka_offset"]: str(offset).encode(),
            COMMIT_HEADER: commit.encode(),
        }
        producer.produce(topic, value=f"{{v{offset}".encode(), headers=list(headers.items()))
    assert producer.flush(10) == 0


@pytest.mark.integration
def test_a_letter_an_older_copy_doubled_is_counted_once_and_only_the_missing_are_sent(
    tmp_path: Path, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    """An at-least-once copy (before this design) sent a commit's first letter twice and never
    its other two: 3 letters in the topic for a commit of 3. The count collects distinct source
    coordinates (1 of 3), so the copy sends the two missing letters, not nothing (a count by
    number) and not all three again."""
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    quarantine = load_or_create_quarantine_table(catalog, SPEC)
    letter_rows(quarantine, [(0, o, "c5", f"{{v{o}".encode()) for o in (1, 2, 3)], lambda _: b"k")
    dead = create_topic(partitions=1)
    config = kafka.client_config()
    old_copy(config, dead, "c5", [1, 1, 1])
    pending = [PendingCopy("c5", 0, 3)]

    present = count_copies(config, dead, pending, SPEC.name)
    assert sizes(present) == {"c5": 1}
    producer = dead_letter_producer(config, SPEC.name)
    assert publish_dead_letters(producer, dead, quarantine, ["c5"], present) == 2
    assert read_committed(kafka, dead, 1) == [b"{v1"] * 3 + [b"{v2", b"{v3"]
    assert sizes(count_copies(config, dead, pending, SPEC.name)) == {"c5": 3}


@pytest.mark.integration
def test_the_count_waits_for_another_producers_open_transaction_instead_of_missing_copies(
    tmp_path: Path, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    """Another producer (a pipeline sharing the topic, a connector) holds a transaction open on
    the dead-letter topic; the pipeline's letters committed after it sit beyond the last stable
    offset. The count waits until that transaction ends and finds them (a count that stopped at
    the last stable offset found none and sent them again)."""
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    quarantine = load_or_create_quarantine_table(catalog, SPEC)
    letter_rows(quarantine, [(0, 1, "c7", b"{a"), (0, 2, "c7", b"{b")], lambda _: b"k")
    dead = create_topic(partitions=1)
    config = kafka.client_config()
    other = open_foreign_transaction(config, dead)
    producer = dead_letter_producer(config, SPEC.name)
    assert publish_dead_letters(producer, dead, quarantine, ["c7"]) == 2
    ends = threading.Timer(3.0, other.abort_transaction)
    ends.start()
    try:
        found = count_copies(config, dead, [PendingCopy("c7", 0, 2)], SPEC.name, timeout_s=20)
    finally:
        ends.join()
    assert sizes(found) == {"c7": 2}
    assert read_committed(kafka, dead, 1) == [b"{a", b"{b"]


@pytest.mark.integration
def test_a_copier_fenced_by_another_counts_again_and_copies_once(
    tmp_path: Path, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    """Two copiers of one pipeline at once (a run's and an operator action's): the first
    counts while another producer's transaction holds the topic, the second initialises the
    pipeline's transactional id meanwhile and fences it. The first starts over (a fresh id
    epoch, a fresh count) instead of failing the action: the letters are read once."""
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    dead = create_topic(partitions=1)
    spec = make_spec("orders", "dead", errors_tolerance="all", dead_letter_topic=dead)
    table = load_or_create_table(catalog, spec)
    commit(table, {0: 3}, 2, "c8")
    letter_rows(
        load_or_create_quarantine_table(catalog, spec),
        [(0, 1, "c8", b"{a"), (0, 2, "c8", b"{b")],
        lambda _: b"k",
    )
    config = kafka.client_config()
    other = open_foreign_transaction(config, dead)
    outcome: list[Any] = []
    copier = threading.Thread(
        target=lambda: outcome.append(
            copy_pending_dead_letters(catalog, spec, table, kafka.get_admin_client(), config)
        )
    )
    copier.start()
    time.sleep(3)  # the copier counts, waiting for the other transaction
    dead_letter_producer(config, spec.name)  # a second copier: fences the first
    other.abort_transaction(10)
    copier.join(60)
    assert [(o.copies, o.created_topic) for o in outcome] == [(2, False)]
    assert read_committed(kafka, dead, 1) == [b"{a", b"{b"]
