"""The checks as pure functions over what was read: a pipeline state, an audit (unit level)."""

from __future__ import annotations

from typing import Any

import pytest

from ingestion.audit import AuditResult, PipelineAudit
from ingestion.checks import (
    AUDIT_CHECK,
    GROUP_CHECK,
    STATE_CHECKS,
    check_commit_freshness,
    check_dead_letter_rate,
    check_exactly_once,
    check_group_consistency,
    check_retention_risk,
    check_watermark_reachable,
    evaluate_state_checks,
)
from ingestion.commit_audit import CommitAudit
from ingestion.offsets import CommittedState, TopicOffsets
from ingestion.state import Commit, PipelineState
from ingestion.status import build_status
from ingestion.topics import PartitionState, TopicState
from tests.support.pipelines import make_spec

SPEC = make_spec("orders", "health", retention_margin_records=100, freshness_bound_seconds=60)


def state(
    committed: dict[int, int] | None = None,
    ends: dict[int, int] | None = None,
    starts: dict[int, int] | None = None,
    **changes: Any,
) -> PipelineState:
    ends = ends or {0: 10}
    starts = starts or {}
    parts = tuple(PartitionState(p, starts.get(p, 0), e) for p, e in ends.items())
    result = PipelineState(
        SPEC, table_exists=True, topics=[TopicState("orders", "id", parts)], read_at_ms=1_000_000
    )
    if committed is not None:
        result.committed = CommittedState(1, {"orders": TopicOffsets("id", committed)}, "c", "k")
        result.group_offsets = {("orders", p): o for p, o in committed.items()}
        result.table_has_rows = True
    for key, value in changes.items():
        setattr(result, key, value)
    return result


def commit(age_s: float, records: int = 10, dead: int = 0, now_ms: int = 1_000_000) -> Commit:
    return Commit(
        snapshot_id=1,
        timestamp_ms=now_ms - int(age_s * 1000),
        records=records,
        quarantined=dead,
        offsets={},
        properties={},
    )


@pytest.mark.parametrize(
    ("current", "passed", "severity", "text"),
    [
        (state({0: 10}), True, "ERROR", "group ids agree"),
        (state(None, other_groups={"cg-control"}), False, "ERROR", "Fix: set consumer_group_id"),
        (state({0: 10}, group_state="STABLE"), False, "ERROR", "active members"),
        (state({0: 5}, group_offsets={("orders", 0): 9}), False, "ERROR", "ahead of the table"),
        (state({0: 9}, group_offsets={("orders", 0): 5}), False, "WARN", "behind the table"),
        (state({0: 9}, group_offsets={}), False, "WARN", "next run repairs it"),
    ],
    ids=["ok", "other-group", "foreign-member", "ahead", "behind", "missing-mirror"],
)
def test_group_consistency(current: PipelineState, passed: bool, severity: str, text: str) -> None:
    finding = check_group_consistency(current)
    assert (finding.passed, finding.severity) == (passed, severity)
    assert text in finding.message


@pytest.mark.parametrize(
    ("current", "passed", "text"),
    [
        (state({0: 10}, commits=[commit(3600)]), True, "table is current"),  # idle is healthy
        (state({0: 4}, commits=[commit(30)]), True, "6 records pending"),
        (state({0: 4}, commits=[commit(120)]), False, "6 records are waiting"),
        (state(None), False, "last commit was never"),
    ],
    ids=["idle", "lag-recent", "lag-stale", "never-committed"],
)
def test_commit_freshness(current: PipelineState, passed: bool, text: str) -> None:
    finding = check_commit_freshness(current, now_ms=1_000_000)
    assert finding.passed is passed
    assert text in finding.message


@pytest.mark.parametrize(
    ("current", "passed", "severity", "text"),
    [
        (state({0: 5}, ends={0: 500}), True, "ERROR", "clear of the retention"),  # log starts at 0
        (state({0: 5}, ends={0: 500}, starts={0: 8}), False, "ERROR", "deleted by retention"),
        (state({0: 50}, ends={0: 500}, starts={0: 8}), False, "WARN", "within 100 offsets"),
        (state({0: 500}, ends={0: 500}, starts={0: 450}), True, "ERROR", "clear"),  # no lag
    ],
    ids=["never-deleted", "lost", "at-risk", "caught-up"],
)
def test_retention_risk(current: PipelineState, passed: bool, severity: str, text: str) -> None:
    finding = check_retention_risk(current)
    assert (finding.passed, finding.severity) == (passed, severity)
    assert text in finding.message


def test_dead_letter_rate_and_watermark() -> None:
    low = state({0: 10}, commits=[commit(1, records=990, dead=10)])
    high = state({0: 10}, commits=[commit(1, records=90, dead=10)])
    assert check_dead_letter_rate(low).passed
    assert not check_dead_letter_rate(high).passed
    assert "10 of 100 records (10.00%)" in check_dead_letter_rate(high).message
    assert check_watermark_reachable(state({0: 1})).passed
    lost = state(None, table_has_rows=True)
    assert not check_watermark_reachable(lost).passed


@pytest.mark.parametrize(
    ("current", "oldest_ms", "lag", "oldest_age", "last_age", "failing"),
    [
        (state({0: 10}, commits=[commit(5)]), {}, 0, None, 5.0, []),
        (
            state({0: 4}, commits=[commit(120)]),
            {("orders", 0): 1_000_000 - 90_000},
            6,
            90.0,
            120.0,
            ["commit_freshness"],
        ),
        # lag in seconds is the oldest uncommitted record's age (1 s), not "never committed"
        (state(None), {("orders", 0): 999_000}, 10, 1.0, None, []),
        (
            state({0: 10}, ends={0: 10, 1: 3}, commits=[commit(1)]),
            {("orders", 1): 990_000},
            3,
            10.0,
            1.0,
            [],  # a partition added to the topic: read from its log start
        ),
        (state({0: 10}, group_state="STABLE"), {}, 0, None, None, ["group_id_consistency"]),
    ],
    ids=["current", "stale", "never-committed", "new-partition", "foreign-member"],
)
def test_build_status(
    current: PipelineState,
    oldest_ms: dict[tuple[str, int], int],
    lag: int,
    oldest_age: float | None,
    last_age: float | None,
    failing: list[str],
) -> None:
    """Lag, its age (the oldest uncommitted record over all partitions) and the failing checks."""
    current.oldest_uncommitted_ms = oldest_ms
    status = build_status(current, evaluate_state_checks(current), now_ms=1_000_000)
    assert status.lag_records == lag
    assert status.oldest_uncommitted_age_s == oldest_age
    assert status.last_commit_age_s == last_age
    assert sorted(status.failing) == failing
    assert set(status.checks) == {GROUP_CHECK.name, *(check.name for check in STATE_CHECKS)}
    by_partition = {p.partition: p for p in status.partitions}
    assert sum(p.lag for p in status.partitions) == lag
    for (topic, partition), stamp in oldest_ms.items():
        assert by_partition[f"{topic}:{partition}"].oldest_uncommitted_age_s == round(
            (1_000_000 - stamp) / 1000, 1
        )
    assert status.to_dict()["failing_checks"] == status.failing


@pytest.mark.parametrize(
    ("audit", "outcome", "text"),
    [
        (None, "skipped", "does not exist yet"),
        (PipelineAudit(CommitAudit(cursor=7, recounted=[7])), "passed", "1 commit(s) recounted"),
        (PipelineAudit(CommitAudit(notes=["first commit"])), "passed", "0 commit(s)"),
        (
            PipelineAudit(CommitAudit(), AuditResult(rows=5, duplicates=[("t", 0, 3)])),
            "failed",
            "duplicates: 1",
        ),
        (
            PipelineAudit(CommitAudit(findings=["snapshot 7 added 5 but Kafka holds 6"])),
            "failed",
            "added 5 but Kafka holds 6",
        ),
    ],
    ids=["no-table", "clean", "not-verifiable", "duplicate", "count-mismatch"],
)
def test_exactly_once_audit(audit: PipelineAudit | None, outcome: str, text: str) -> None:
    """Loss shows as a count mismatch, duplicates as such; a missing table is not a pass; the
    cursor for the next evaluation is in the metadata."""
    finding = check_exactly_once("demo.orders", audit)
    observed = "skipped" if finding.skipped else "passed" if finding.passed else "failed"
    assert observed == outcome
    assert text in finding.message
    assert finding.blocks is (outcome == "failed")
    if audit is not None:
        assert finding.metadata["audit_cursor"] == str(audit.commits.cursor or "")


def test_every_check_has_one_name() -> None:
    """The registry names each check once; the Dagster layer and the CLI take names from it."""
    names = [check.name for check in (GROUP_CHECK, *STATE_CHECKS, AUDIT_CHECK)]
    assert len(set(names)) == len(names) == 6
    assert GROUP_CHECK.blocking
    assert not any(check.blocking for check in STATE_CHECKS)


def test_a_missing_topic_fails_freshness_by_name() -> None:
    """One pipeline's missing topic is named by its check; nothing else hides it."""
    current = state({0: 10}, commits=[commit(5)], missing_topics=["orders-eu"])
    finding = check_commit_freshness(current)
    assert finding.blocks
    assert "topic(s) ['orders-eu'] of pipeline 'health' do not exist" in finding.message


def test_checks_are_not_evaluated_while_the_group_check_blocks() -> None:
    """Under a group id that holds no progress, the other checks say why they did not run."""
    blocked = state(None, other_groups={"cg-control"}, table_has_rows=True)
    findings = evaluate_state_checks(blocked)
    assert findings[GROUP_CHECK.name].blocks
    others = [findings[check.name] for check in STATE_CHECKS]
    assert all(f.skipped and f.metadata["blocked_by"] == GROUP_CHECK.name for f in others)
    assert all("not evaluated" in f.message for f in others)
