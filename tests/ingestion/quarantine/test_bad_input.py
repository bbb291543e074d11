"""Bad input and schema change on the real stack: never dropped silently (R33, R35, R36)."""

from __future__ import annotations

from typing import Literal

import pytest

from ingestion import exceptions
from ingestion.audit.oracle import read_coordinates
from ingestion.pipeline.hooks import FailureHooks
from ingestion.spec.pipeline import PipelineSpec
from tests.support.ledger import Ledger, LedgerProducer, Record
from tests.support.pipelines import CreateTopic, Harness, NewPipeline, crash, make_spec, records

pytestmark = pytest.mark.integration

BAD_VALUES = [
    b"{not json",  # malformed
    b"\xff\xfe{}",  # wrong encoding
    None,  # tombstone
    b'{"id": 5, "ts": "yesterday"}',  # broken timestamp
    b'{"name": "no id"}',  # missing required field
    b'{"id": "seven"}',  # type change string -> long (not a promotion)
    b'{"id": 1, "amount": 1.234}',  # more scale than decimal(10,2): no silent rounding
]


def test_bad_record_fails_the_run_by_default_naming_it(
    harness: Harness, new_pipeline: NewPipeline
) -> None:
    """R33 with errors_tolerance=none: the run fails naming topic, partition and offset."""
    bad: Record = (b"k", b"{not json", None)
    topic, spec = new_pipeline("bad_default", produce=[*records(5), bad, *records(5, 5)])
    with pytest.raises(exceptions.TaskFailedError) as excinfo:
        harness.run(spec)
    message = str(excinfo.value)
    assert f"{topic}[0] offset 5 could not be decoded" in message
    assert "errors_tolerance: all" in message
    assert harness.table(spec).current_snapshot() is None


def test_bad_records_are_quarantined_exactly_once(
    harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """R33, R35, R36: bad records quarantined once (even when a run dies after writing their
    files, before its data commit), good records land, new fields become optional columns
    before the data commit."""
    bad: list[Record] = [(f"bad{i}".encode(), value, i % 2) for i, value in enumerate(BAD_VALUES)]
    evolving: Record = (b"new", b'{"id": 99, "coupon": "XMAS", "nested": {"a": 1}}', 0)
    _, spec = new_pipeline(
        "quarantine", partitions=2, produce=[*records(40), *bad, evolving], errors_tolerance="all"
    )

    with pytest.raises(exceptions.IngestionError):  # dies before the data commit (R33)
        harness.run(spec, hooks=FailureHooks({"before_catalog_call": crash}))
    report = harness.run(spec)
    assert report.committed
    assert report.records == 41
    assert report.quarantined == len(BAD_VALUES)
    assert not report.schema_changes  # the first run's schema commit stands (its own commit)
    result = harness.assert_exactly_once(spec, ledger)
    assert result.quarantined == len(BAD_VALUES)

    table = harness.table(spec)
    assert table.schema().find_field("coupon").optional
    row = table.scan(row_filter="id = 99").to_arrow().to_pylist()[0]
    assert row["coupon"] == "XMAS"
    assert row["nested"] == {"a": 1}
    quarantine = harness.catalog.load_table(spec.quarantine_table)
    assert len(read_coordinates(quarantine)) == len(BAD_VALUES), "the dead run left no row"
    live = quarantine.scan().to_arrow().to_pylist()  # a plain reader: no filter
    assert sorted(r["value"] or b"" for r in live) == sorted(v or b"" for v in BAD_VALUES)
    tombstone = next(r for r in live if r["value"] is None)
    assert tombstone["error_class"] == "NullValue"
    assert tombstone["_kafka_key"] == b"bad2"


def test_valid_promotions_evolve_the_table(
    harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """R35: an int column receiving a long value is promoted to long (the coordinator's schema
    commit), a decimal widens its precision; string into a number column is still rejected."""
    values = [
        b'{"id": 1, "amount": 12.50}',
        b'{"id": 3000000000, "amount": 1.00}',
        b'{"id": 2, "amount": 123456789.12}',
        b'{"id": "three"}',
    ]
    _, spec = new_pipeline(
        "promotions",
        produce=[(f"k{i}".encode(), v, None) for i, v in enumerate(values)],
        errors_tolerance="all",
        schema=[
            {"name": "id", "type": "int", "required": True},
            {"name": "amount", "type": "decimal(6,2)"},
        ],
    )
    report = harness.run(spec)
    assert report.schema_changes == ["promoted amount to decimal128(38, 2)", "promoted id to int64"]
    assert report.records == 3
    assert report.quarantined == 1
    table = harness.table(spec)
    assert str(table.schema().find_field("id").field_type) == "long"
    ids = sorted(table.scan().to_arrow().column("id").to_pylist())
    assert ids == [1, 2, 3_000_000_000]
    harness.assert_exactly_once(spec, ledger)


def test_dead_letter_topic_copy_after_a_crash_with_headers(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R33 + dead-letter topic: a crash after the commit loses no copy; the next run sends it,
    with Kafka Connect's context headers, and the mirror follows."""
    from confluent_kafka import TopicPartition

    topic = create_topic(partitions=1)
    dead = create_topic(partitions=1, name=f"{topic}-dlq")
    spec = make_spec(topic, "dlq", errors_tolerance="all", dead_letter_topic=dead)
    ledger_producer.produce(topic, [*records(5), (b"bad", b"{oops", None), *records(5, 5)])
    with pytest.raises(exceptions.InjectedFailure):
        harness.run(spec, hooks=FailureHooks({"before_mirror": crash}))
    repaired = harness.run(spec)
    assert not repaired.committed
    assert repaired.dead_letter_copies == 1
    assert repaired.mirror is not None
    assert repaired.mirror.ok
    assert harness.run(spec).dead_letter_copies == 0  # mirrored: nothing left to copy
    harness.assert_exactly_once(spec, ledger)
    consumer = harness.kafka.get_consumer()
    try:
        consumer.assign([TopicPartition(dead, 0, 0)])
        messages = consumer.consume(10, timeout=5)
    finally:
        consumer.close()
    assert [m.value() for m in messages] == [b"{oops"]
    headers = dict(messages[0].headers() or [])
    assert headers["__connect.errors.topic"] == topic.encode()
    assert headers["__connect.errors.offset"] == b"5"
    assert headers["__connect.errors.exception.class.name"] == b"ArrowInvalid"


def test_dead_letters_already_copied_are_not_copied_again(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """The copies went out but the Kafka group mirror stayed behind (rewound here, as a foreign
    member would keep it): the next run finds the copies by commit id and sends none again."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    topic = create_topic(partitions=1)
    dead = create_topic(partitions=2, name=f"{topic}-dlq")
    spec = make_spec(topic, "dlq_once", errors_tolerance="all", dead_letter_topic=dead)
    bad = [(b"bad1", b"{oops", None), (b"bad2", b"[1,", None)]
    ledger_producer.produce(topic, [*records(5), *bad, *records(5, 5)])
    assert harness.run(spec).dead_letter_copies == 2
    admin = harness.kafka.get_admin_client()
    rewind = ConsumerGroupTopicPartitions(spec.consumer_group_id, [TopicPartition(topic, 0, 0)])
    for future in admin.alter_consumer_group_offsets([rewind]).values():
        future.result(10)

    repaired = harness.run(spec)

    assert not repaired.committed
    assert repaired.dead_letter_copies == 0
    assert repaired.mirror is not None
    assert repaired.mirror.ok
    consumer = harness.kafka.get_consumer()
    try:  # read to the end
        consumer.assign([TopicPartition(dead, 0, 0), TopicPartition(dead, 1, 0)])
        copies: list[bytes | None] = []
        while batch := consumer.consume(10, timeout=3):
            copies += [m.value() for m in batch]
    finally:
        consumer.close()
    assert sorted(c or b"" for c in copies) == [b"[1,", b"{oops"]
    harness.assert_exactly_once(spec, ledger)


def test_large_dirty_batch_lands_every_good_record_once(
    harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """R33: 20,000 records decoded as one batch with bad values in the middle (syntax error,
    type error, blank) and a multi-line object: every good record lands once, each bad one is
    quarantined once, and the multi-line object is decoded in the bulk path."""
    bad: list[Record] = [(b"bad-syntax", b'{"id": 1, "amount": ', None)]
    bad += [(b"bad-type", b'{"id": "x"}', None), (b"bad-blank", b" ", None)]
    multi_line: Record = (b"lines", b'{\n  "id": 20000,\n  "name": "multi-line"\n}', None)
    produce = [*records(10_000), *bad, multi_line, *records(10_000, 10_000)]
    _, spec = new_pipeline(
        "dirty_batch", produce=produce, errors_tolerance="all", max_records_per_task=50_000
    )
    report = harness.run(spec)
    assert report.committed
    assert (report.records, report.quarantined) == (20_001, 3)
    assert not report.schema_changes
    harness.assert_exactly_once(spec, ledger)
    quarantine = harness.catalog.load_table(spec.quarantine_table).scan().to_arrow()
    assert sorted(quarantine.column("_kafka_key").to_pylist()) == sorted(
        k or b"" for k, _, _ in bad
    )
    row = harness.table(spec).scan(row_filter="id = 20000").to_arrow().to_pylist()
    assert [r["name"] for r in row] == ["multi-line"]
    # the syntax error is screened out; only the type error and the blank are decoded alone
    stats = report.decode_stats
    assert (stats.screen_rejected, stats.single_parses) == (1, 2)
    assert stats.bulk_parses <= 2 + 2 * 15  # a failed bulk parse, the screened rest, bisection


@pytest.mark.parametrize(
    ("kind", "bad"),
    [
        ("malformed", b'{"id": 10000, "name": "cut'),  # truncated
        ("missing", b'{"name": "no id"}'),  # missing required field
        ("latin1", b'{"id": 10000, "name": "caf\xe9"}'),  # inside a string: not UTF-8
    ],
)
def test_one_bad_record_in_20k_lands_the_rest_once_on_the_fast_path(
    kind: str, bad: bytes, harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """R33: one bad value in the middle of a 20,000-record batch: 19,999 rows land once, the
    bad one is quarantined once, and no value was decoded alone (the screen rejected it; at
    most two bulk parses), counted by the run's decode stats, not timed."""
    produce = [*records(10_000), (b"bad", bad, None), *records(9_999, 10_001)]
    _, spec = new_pipeline(
        f"one_bad_{kind}", produce=produce, errors_tolerance="all", max_records_per_task=50_000
    )
    report = harness.run(spec)
    assert report.committed
    assert (report.records, report.quarantined) == (19_999, 1)
    harness.assert_exactly_once(spec, ledger)
    quarantine = harness.catalog.load_table(spec.quarantine_table).scan().to_arrow()
    assert quarantine.column("value").to_pylist() == [bad]
    assert quarantine.column("_kafka_offset").to_pylist() == [10_000]
    ids = harness.table(spec).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    assert sorted(ids) == [i for i in range(20_000) if i != 10_000]
    stats = report.decode_stats
    assert (stats.screen_rejected, stats.single_parses) == (1, 0)
    assert stats.bulk_parses <= 2


def read_letters(harness: Harness, topic: str) -> list[bytes | None]:
    """Every record of ``topic``, read to the end by a plain read_committed consumer."""
    from confluent_kafka import TopicPartition

    metadata = harness.kafka.get_admin_client().list_topics(topic, timeout=10).topics[topic]
    consumer = harness.kafka.get_consumer()  # read_committed (ingestion.kafka.consumer)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in metadata.partitions])
        letters: list[bytes | None] = []
        while batch := consumer.consume(100, timeout=3):
            letters += [m.value() for m in batch if m.error() is None]
    finally:
        consumer.close()
    return letters


def reset_to(
    harness: Harness, spec: PipelineSpec, to: Literal["earliest", "latest"], reason: str
) -> None:
    """Plan and apply a reset of ``spec`` to ``to`` as the operator's command does: it copies
    the owed dead letters first and moves the Kafka group."""
    from ingestion.ops.reset import apply_reset, plan_reset
    from ingestion.spec.pipeline import StartingPosition

    admin = harness.kafka.get_admin_client()
    consumer = harness.kafka.get_consumer()
    try:
        planned = plan_reset(spec, harness.table(spec), admin, consumer, StartingPosition(mode=to))
    finally:
        consumer.close()
    apply_reset(
        harness.catalog,
        spec,
        planned,
        harness.cluster_id,
        "ops",
        reason,
        admin=admin,
        kafka_config=harness.kafka.client_config(),
    )


def test_missing_dead_letter_topic_is_created_and_gets_each_letter_once(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """A dead_letter_topic that does not exist yet (Kafka Connect creates its own): the run
    creates it, copies each dead letter once and mirrors the group to the table's offsets."""
    from ingestion.health.checks import check_group_consistency
    from ingestion.health.state import read_state
    from ingestion.pipeline.mirror import read_group_offsets
    from ingestion.table.offsets import find_committed_state, flatten

    topic = create_topic(partitions=2)
    dead = f"{topic}-new-dlq"  # not created: the run must create it
    spec = make_spec(
        topic,
        "dlq_missing",
        errors_tolerance="all",
        dead_letter_topic=dead,
        in_process_max_records=1_000,
    )
    bad: list[Record] = [(f"bad{i}".encode(), b"{oops" + bytes([48 + i]), i % 2) for i in range(3)]
    ledger_producer.produce(topic, [*records(20), *bad, *records(10, 20)])

    report = harness.run(spec)

    assert report.dead_letter_error is None
    assert report.dead_letter_copies == len(bad)
    assert sorted(v or b"" for v in read_letters(harness, dead)) == sorted(b[1] or b"" for b in bad)
    group = spec.consumer_group_id
    committed = find_committed_state(harness.table(spec), group)
    assert committed is not None
    admin = harness.kafka.get_admin_client()
    assert read_group_offsets(admin, group) == flatten(committed.offsets)
    consumer = harness.kafka.get_consumer()
    try:
        state = read_state(spec, harness.table(spec), admin, consumer)
    finally:
        consumer.close()
    assert check_group_consistency(state).passed, check_group_consistency(state).message
    assert harness.run(spec).dead_letter_copies == 0  # nothing owed: nothing sent again
    assert len(read_letters(harness, dead)) == len(bad)
    harness.assert_exactly_once(spec, ledger)


def test_refused_dead_letter_topic_creation_names_pipeline_topic_and_why(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """A broker that refuses to create the dead-letter topic (here: 3 replicas on a one-broker
    cluster; ACLs or a policy alike): the data commit stands, the run's error names the pipeline,
    the topic and the broker's reason, the mirror waits, and the group check says that the
    dead-letter copy failed and why, not that "the next run repairs it"."""
    from ingestion.health.checks import check_group_consistency
    from ingestion.health.state import read_state

    topic = create_topic(partitions=1)
    dead = f"{topic}-refused-dlq"
    spec = make_spec(
        topic,
        "dlq_refused",
        errors_tolerance="all",
        dead_letter_topic=dead,
        dead_letter_topic_replication_factor=3,
        in_process_max_records=1_000,
    )
    ledger_producer.produce(topic, [*records(5), (b"bad", b"{oops", None), *records(5, 5)])

    report = harness.run(spec)

    assert report.committed
    assert report.dead_letter_error is not None
    assert f"pipeline 'dlq_refused': dead-letter topic {dead!r} does not exist" in (
        report.dead_letter_error
    )
    assert "INVALID_REPLICATION_FACTOR" in report.dead_letter_error
    admin = harness.kafka.get_admin_client()
    consumer = harness.kafka.get_consumer()
    try:
        state = read_state(spec, harness.table(spec), admin, consumer)
    finally:
        consumer.close()
    finding = check_group_consistency(state)
    assert not finding.passed
    assert f"the dead-letter copy to topic {dead!r} cannot be made" in finding.message
    assert "INVALID_REPLICATION_FACTOR" in finding.message
    assert "the next run repairs it" not in finding.message
    assert finding.metadata["dead_letters_owed"] == 1
    assert dead not in admin.list_topics(timeout=10).topics  # the check created nothing

    fixed = spec.model_copy(update={"dead_letter_topic_replication_factor": -1})
    repaired = harness.run(fixed)
    assert repaired.dead_letter_error is None
    assert repaired.dead_letter_copies == 1
    assert read_letters(harness, dead) == [b"{oops"]
    harness.assert_exactly_once(spec, ledger)


@pytest.mark.parametrize("action", ["migrate", "reset"])
def test_an_operator_action_copies_owed_dead_letters_before_it_moves_the_group(
    action: str,
    harness: Harness,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
) -> None:
    """R33: a commit's dead-letter copy failed, so the group stayed behind it on
    purpose. A migration (or a forward reset) then moved the group to the table's offsets
    without copying, and the search for uncopied commits, which stops at the first commit the
    group has passed, never found that commit again: its letter never reached the topic. Now
    the action copies first; while the copy fails it is refused with nothing changed, and once
    the topic can be made the letter is copied once."""
    from ingestion.ops.reset import migrate_group

    topic = create_topic(partitions=1)
    dead = f"{topic}-owed-dlq"
    spec = make_spec(
        topic,
        f"dlq_owed_{action}",
        errors_tolerance="all",
        dead_letter_topic=dead,
        dead_letter_topic_replication_factor=3,
        in_process_max_records=1_000,
    )
    ledger_producer.produce(topic, [*records(5), (b"bad", b"{owed", None), *records(5, 5)])
    assert harness.run(spec).dead_letter_error is not None  # refused: 3 replicas on one broker
    fixed = spec.model_copy(update={"dead_letter_topic_replication_factor": -1})
    admin, config = harness.kafka.get_admin_client(), harness.kafka.client_config()
    catalog = harness.catalog

    def act(on: PipelineSpec) -> None:
        if action == "migrate":
            migrate_group(
                catalog,
                on,
                f"{on.consumer_group_id}-new",
                admin,
                "ops",
                "new group",
                kafka_config=config,
            )
            return
        ledger_producer.produce(topic, records(2, 10))  # skipped by the forward reset
        reset_to(harness, on, "latest", "skip ahead")

    head = harness.table(spec).metadata.current_snapshot_id
    with pytest.raises(exceptions.OperationRefusedError) as refused:
        act(spec)
    message = str(refused.value)
    assert f"pipeline {spec.name!r}" in message, message
    assert f"not copied to {dead!r} yet" in message, message
    assert "INVALID_REPLICATION_FACTOR" in message, message
    assert "The offsets were not changed" in message, message
    assert harness.table(spec).metadata.current_snapshot_id == head

    act(fixed)
    assert read_letters(harness, dead) == [b"{owed"]
    if action == "migrate":  # runs under the new group copy nothing twice, lose nothing
        moved = fixed.model_copy(update={"consumer_group_id": f"{spec.consumer_group_id}-new"})
        ledger_producer.produce(topic, [*records(2, 20), (b"bad2", b"{later", None)])
        assert harness.run(moved).dead_letter_error is None
        assert sorted(read_letters(harness, dead), key=str) == [b"{later", b"{owed"]
        harness.assert_exactly_once(moved, ledger)


def test_a_backward_reset_re_reads_bad_records_and_the_dead_letter_topic_keeps_each_once(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R33: a backward reset re-reads a range whose bad records were quarantined and
    copied; the re-read quarantines them again under a new commit (the quarantine table still
    holds each once), and before, the copy sent their letters again, so a read_committed reader
    of the dead-letter topic saw each bad source record twice. Now the reset records which
    letters it re-reads were delivered, by exact offset: a bad record a forward reset had
    skipped is read for the first time by the re-read and is sent (a threshold would have lost
    it), a second reset over the range sends nothing again, a new bad record is sent once."""
    from ingestion.quarantine.dead_letters import DELIVERED

    topic = create_topic(partitions=1)
    dead = f"{topic}-dlq"
    spec = make_spec(
        topic,
        "dlq_rewind",
        errors_tolerance="all",
        dead_letter_topic=dead,
        in_process_max_records=1_000,
    )

    ledger_producer.produce(topic, [*records(5), (b"bad", b"{first", None), *records(5, 5)])
    assert harness.run(spec).dead_letter_copies == 1
    ledger_producer.produce(topic, [(b"bad1", b"{skipped", None), *records(1, 10)])
    reset_to(harness, spec, "latest", "skip")  # skips {skipped}: never quarantined, never sent
    reset_to(harness, spec, "earliest", "re-read")  # {first} was sent, {skipped} was not
    assert harness.run(spec).dead_letter_copies == 1
    reset_to(harness, spec, "earliest", "again")  # over the same range: its letters are there
    ledger_producer.produce(topic, [*records(2, 11), (b"bad2", b"{second}x", None)])
    report = harness.run(spec)
    assert report.committed
    assert report.dead_letter_error is None
    assert report.dead_letter_copies == 1

    expected = [b"{first", b"{second}x", b"{skipped"]
    assert sorted(read_letters(harness, dead), key=str) == expected
    quarantined = harness.catalog.load_table(spec.quarantine_table).scan().to_arrow()
    assert sorted(quarantined.column("value").to_pylist()) == expected
    harness.assert_exactly_once(spec, ledger)
    assert DELIVERED in harness.table(spec).properties


def test_a_backward_reset_fills_a_dead_letter_topic_configured_later(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """A dead-letter topic added to a pipeline that had quarantined records already, then a
    reset to the earliest offsets to fill it (R33): the reset lists only letters
    it finds in the topic, so the re-read sends the early record's letter, once."""

    topic = create_topic(partitions=1)
    plain = make_spec(topic, "dlq_later", errors_tolerance="all", in_process_max_records=1_000)
    ledger_producer.produce(topic, [*records(3), (b"bad", b"{early", None)])
    assert harness.run(plain).quarantined == 1
    dead = f"{topic}-dlq"
    spec = plain.model_copy(update={"dead_letter_topic": dead})
    reset_to(harness, spec, "earliest", "fill the new topic")
    assert harness.run(spec).dead_letter_copies == 1
    assert harness.run(spec).dead_letter_copies == 0
    assert read_letters(harness, dead) == [b"{early"]
    harness.assert_exactly_once(spec, ledger)
