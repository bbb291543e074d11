"""Where the Kafka group mirror may move, and what the group check says (unit level, R8, R48)."""

from __future__ import annotations

import pytest

from ingestion.health.checks import check_group_consistency
from ingestion.health.state import PipelineState
from ingestion.kafka.topics import PartitionState, TopicState
from ingestion.table.offsets import CommittedState, TopicOffsets
from ingestion.table.rewind import Retirement, RewindSource, plan_mirror
from tests.support.pipelines import make_spec

A, B = ("orders", 0), ("orders", 1)
RESET = RewindSource(7, {A: 30, B: 12}, "operator", "the offset reset by 'ops' (...) moved it")
ROLLBACK = RewindSource(9, {A: 40, B: 12}, "rollback", "the table was rolled back: ...")


@pytest.mark.parametrize(
    ("group", "sources", "forward", "back", "left_ahead"),
    [
        ({A: 10, B: 12}, [], {A: 20}, {}, {}),  # an ordinary commit: forward only
        ({A: 30, B: 12}, [], {}, {}, {A: 30}),  # ahead, nothing recorded: a foreign writer's
        ({A: 30, B: 12}, [RESET], {}, {A: 20}, {}),  # at the position a reset left behind
        ({A: 40, B: 12}, [RESET, ROLLBACK], {}, {A: 20}, {}),  # at a rolled-back commit
        ({A: 31, B: 12}, [RESET, ROLLBACK], {}, {}, {A: 31}),  # near one is not at one
        ({A: 30, B: 11}, [RESET], {B: 12}, {}, {A: 30}),  # must match on every partition
        ({A: 30}, [RESET], {B: 12}, {A: 20}, {}),  # a partition the group lacks moves on
    ],
    ids=["forward", "foreign", "reset", "rollback", "near", "partial", "missing-partition"],
)
def test_the_mirror_moves_back_only_from_a_left_behind_position(
    group: dict[tuple[str, int], int],
    sources: list[RewindSource],
    forward: dict[tuple[str, int], int],
    back: dict[tuple[str, int], int],
    left_ahead: dict[tuple[str, int], int],
) -> None:
    """R8: a zombie's mirror writes the table's current offsets only, and moves the group back
    only while the group sits exactly at a position the table recorded as left behind."""
    plan = plan_mirror({A: 20, B: 12}, group, sources)
    assert (plan.forward, plan.back, plan.left_ahead) == (forward, back, left_ahead)


SPEC = make_spec("orders", "rewind_unit")


def state(group: dict[tuple[str, int], int], **changes: object) -> PipelineState:
    parts = (PartitionState(0, 0, 50), PartitionState(1, 0, 50))
    result = PipelineState(SPEC, table_exists=True, topics=[TopicState("orders", "id", parts)])
    result.committed = CommittedState(3, {"orders": TopicOffsets("id", {0: 20, 1: 12})}, "c", "k")
    result.table_has_rows = True
    result.group_offsets = group
    for key, value in changes.items():
        setattr(result, key, value)
    return result


@pytest.mark.parametrize(
    ("current", "blocks", "severity", "text"),
    [
        (state({A: 30, B: 12}, rewinds=[RESET]), False, "WARN", "moved back to the table's"),
        (state({A: 30, B: 12}, rewinds=[RESET]), False, "WARN", "offset reset by 'ops'"),
        (state({A: 40, B: 12}, rewinds=[ROLLBACK]), False, "WARN", "rolled back"),
        (state({A: 33, B: 12}, rewinds=[RESET]), True, "ERROR", "another writer"),
        (
            state(
                {A: 20, B: 12},
                retirement=Retirement(5, "group-rewind_unit", "new-group", "group migration x"),
            ),
            True,
            "ERROR",
            "retired by the group migration x",
        ),
    ],
    ids=["reset", "reset-names-who", "rollback", "foreign-writer", "retired"],
)
def test_the_group_check_tells_a_recorded_rewind_from_a_foreign_writer(
    current: PipelineState, blocks: bool, severity: str, text: str
) -> None:
    finding = check_group_consistency(current)
    assert (finding.blocks, finding.severity) == (blocks, severity)
    assert text in finding.message
