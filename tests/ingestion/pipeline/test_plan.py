"""The planner as a pure function: every inconsistency fails by name (unit level); and its end
offsets on the real broker (integration)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ingestion import exceptions
from ingestion.kafka.topics import PartitionState, TopicState
from ingestion.pipeline.hooks import FailureHooks
from ingestion.pipeline.plan import Plan, plan_partitions
from ingestion.table.offsets import CommittedState, TopicOffsets
from resources.kafka import KafkaResource
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, NewPipeline, make_spec, records

SPEC = make_spec("orders", "unit")


def topic(
    ends: dict[int, int], starts: dict[int, int] | None = None, topic_id: str = "id1"
) -> TopicState:
    starts = starts or {}
    parts = tuple(PartitionState(p, starts.get(p, 0), e) for p, e in sorted(ends.items()))
    return TopicState("orders", topic_id, parts)


def committed(offsets: dict[int, int], topic_id: str = "id1") -> CommittedState:
    return CommittedState(1, {"orders": TopicOffsets(topic_id, offsets)}, "c1", "cluster")


def plan(
    state: CommittedState | None, current: TopicState, spec: Any = SPEC, **kwargs: Any
) -> tuple[Any, ...]:
    return plan_partitions(
        spec,
        state,
        [current],
        kwargs.get("starting", {}),
        kwargs.get("has_rows", False),
        kwargs.get("other_groups", set()),
    )


def test_first_run_uses_the_starting_position() -> None:
    start, end, lost, notes = plan(None, topic({0: 10, 1: 5}), starting={("orders", 0): 4})
    assert start == {("orders", 0): 4, ("orders", 1): 0}
    assert end == {("orders", 0): 10, ("orders", 1): 5}
    assert not lost
    assert not notes


def test_resume_from_committed_offsets() -> None:
    start, end, _, _ = plan(committed({0: 7, 1: 5}), topic({0: 10, 1: 5}))
    assert start == {("orders", 0): 7, ("orders", 1): 5}
    assert end == {("orders", 0): 10, ("orders", 1): 5}


@pytest.mark.parametrize(
    ("state", "current", "kwargs", "error", "text"),
    [
        (None, topic({0: 1}), {"has_rows": True}, exceptions.MissingOffsetsError, "holds rows"),
        (None, topic({0: 1}), {"other_groups": {"old"}}, exceptions.GroupMismatchError, "'old'"),
        (
            committed({0: 1}),
            topic({0: 1}, topic_id="id2"),
            {},
            exceptions.TopicRecreatedError,
            "id2",
        ),
        (committed({0: 1, 1: 1}), topic({0: 1}), {}, exceptions.PartitionVanishedError, "[1]"),
        (committed({0: 9}), topic({0: 5}), {}, exceptions.OffsetOutOfRangeError, "above the end"),
        (committed({0: 2}), topic({0: 9}, {0: 4}), {}, exceptions.DataLossError, "[2, 4)"),
    ],
    ids=[
        "R31-rows-no-offsets",
        "R22-other-group",
        "R20-topic-id",
        "R19-partition-gone",
        "R20-truncated",
        "R12-retention",
    ],
)
def test_inconsistencies_fail_by_name(
    state: CommittedState | None,
    current: TopicState,
    kwargs: dict[str, Any],
    error: type[Exception],
    text: str,
) -> None:
    with pytest.raises(error) as excinfo:
        plan(state, current, **kwargs)
    assert text in str(excinfo.value)
    assert "pipeline 'unit'" in str(excinfo.value)


def test_data_loss_skip_records_the_lost_range() -> None:
    """R12 opt-in: start at the log start and record what was lost."""
    spec = make_spec("orders", "unit", on_data_loss="skip")
    start, _, lost, _ = plan(committed({0: 2}), topic({0: 9}, {0: 4}), spec=spec)
    assert start == {("orders", 0): 4}
    assert [(r.start, r.end) for r in lost] == [(2, 4)]


def test_new_partition_starts_at_earliest_and_flags_possible_loss() -> None:
    """R18: a partition added since the last commit starts at its log start."""
    start, _, _, notes = plan(committed({0: 3}), topic({0: 3, 1: 8}, {1: 2}))
    assert start[("orders", 1)] == 2
    assert "orders[1] is new and starts at 2 > 0" in notes[0]


def test_regressing_commit_is_refused() -> None:
    """R11: a plan whose end is below the committed offset never commits."""
    from ingestion.pipeline.commit import commit_data

    regressing = Plan(
        pipeline="unit",
        group_id="g",
        table="t.t",
        table_uuid="u",
        base_snapshot_id=None,
        committed={"orders": TopicOffsets("id1", {0: 9, 1: 3})},
        cluster_id="c",
        topic_ids={"orders": "id1"},
        start={("orders", 0): 9},
        end={("orders", 0): 5},
        tasks=(),
    )
    with pytest.raises(exceptions.OffsetRegressionError, match=r"dropped \[\('orders', 1\)\]"):
        commit_data(catalog=None, plan=regressing, files=[], properties={})  # type: ignore[arg-type]


def watermark(kafka: KafkaResource, topic: str, isolation: str) -> int:
    """The high watermark of ``topic[0]`` as a consumer with ``isolation`` sees it now."""
    from confluent_kafka import TopicPartition

    consumer = kafka.get_consumer(**{"isolation.level": isolation})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    finally:
        consumer.close()
    return int(high)


@pytest.mark.integration
def test_planner_never_plans_past_an_open_transaction(
    harness: Harness,
    new_pipeline: NewPipeline,
    kafka: KafkaResource,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
) -> None:
    """R16: with a transaction open, a run plans to the read_committed end offset, not to the
    high watermark; once it commits, the next run ingests everything exactly once.

    Kafka answers a read_committed end-offset query with the last stable offset (3 here: the
    first open record), below the high watermark (past the open records) that a
    read_uncommitted planner would take.
    """
    topic, spec = new_pipeline("open_transaction")
    ledger_producer.produce(topic, records(3, partition=0))
    transactional = LedgerProducer(kafka, ledger, **{"transactional.id": f"tx-{topic}"})
    planned: list[Plan] = []

    def stop_after_plan(point: str, **context: Any) -> None:
        planned.append(context["plan"])
        raise exceptions.InjectedFailure(point)

    with transactional.open_transaction(topic, records(3, first=3, partition=0)):
        stable = watermark(kafka, topic, "read_committed")
        high = watermark(kafka, topic, "read_uncommitted")
        assert stable == 3 < high, "the broker must hide the open transaction"
        with pytest.raises(exceptions.InjectedFailure):
            harness.run(spec, hooks=FailureHooks({"after_plan": stop_after_plan}))
    assert planned[0].end == {(topic, 0): stable}
    # Committing returns once the coordinator logged the decision; it writes the commit marker
    # to the partition just after, and only then does the last stable offset move (a run in
    # that window plans to 3 again, and the next run takes the rest).
    deadline = time.monotonic() + 30
    while watermark(kafka, topic, "read_committed") < 7 and time.monotonic() < deadline:
        time.sleep(0.1)
    report = harness.run(spec)
    assert report.records == 6
    harness.assert_exactly_once(spec, ledger)
