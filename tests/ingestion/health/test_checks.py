"""The checks as pure functions over what was read: a pipeline state, an audit (unit level)."""

from __future__ import annotations

from typing import Any

import pytest

from ingestion.audit.incremental import AuditMemory, CommitAudit
from ingestion.audit.oracle import AuditResult, PipelineAudit
from ingestion.audit.verdict import check_exactly_once
from ingestion.health.checks import (
    AUDIT_CHECK,
    GROUP_CHECK,
    STATE_CHECKS,
    Finding,
    check_commit_freshness,
    check_dead_letter_rate,
    check_group_consistency,
    check_retention_risk,
    check_watermark_reachable,
    evaluate_state_checks,
)
from ingestion.health.state import Commit, PipelineState
from ingestion.health.status import Evaluated, build_status
from ingestion.kafka.topics import PartitionState, TopicState
from ingestion.table.offsets import VALID_THROUGH_MS, CommittedState, TopicOffsets
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


def commit(
    age_s: float,
    records: int = 10,
    dead: int = 0,
    now_ms: int = 1_000_000,
    valid_through_s: float | None = None,
) -> Commit:
    through = (
        {}
        if valid_through_s is None
        else {VALID_THROUGH_MS: str(now_ms - int(valid_through_s * 1000))}
    )
    return Commit(
        snapshot_id=1,
        timestamp_ms=now_ms - int(age_s * 1000),
        records=records,
        quarantined=dead,
        offsets={},
        properties=through,
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


def test_every_age_of_the_status_is_measured_from_its_now() -> None:
    """The last commit's age and each finding's are those of ``now_ms``, the instant the caller
    assembles (it reads the state after any audit, then assembles at once): a state read at
    1000 s holding a commit from 990 s, assembled at 1090 s, shows the commit 100 s old. A
    finding recorded elsewhere
    (the audit's last evaluation) keeps its time and run, and is stale past its bound; the
    others are fresh, evaluated when the state was read."""
    current = state({0: 10}, commits=[commit(10)])
    audit = Evaluated(850_000, fresh=False, run_id="r1", stale_after_s=60)
    findings = {
        **evaluate_state_checks(current),
        AUDIT_CHECK.name: Finding(passed=True, message="ok"),
    }
    status = build_status(current, findings, now_ms=1_090_000, evaluated={AUDIT_CHECK.name: audit})
    assert (status.as_of_ms, status.last_commit_age_s) == (1_090_000, 100.0)
    recorded = status.checks[AUDIT_CHECK.name]
    assert (recorded["fresh"], recorded["run_id"], recorded["age_s"]) == (False, "r1", 240.0)
    assert (recorded["evaluated_at_ms"], recorded["stale"]) == (850_000, True)
    assert recorded["evaluated_at"] == "1970-01-01T00:14:10Z"
    group = status.checks[GROUP_CHECK.name]
    assert (group["fresh"], group["evaluated_at_ms"], group["age_s"]) == (True, 1_000_000, 90.0)
    assert group["stale"] is False
    assert status.to_dict()["as_of"] == "1970-01-01T00:18:10Z"
    never = Evaluated(None, fresh=False)
    status = build_status(current, findings, now_ms=1_090_000, evaluated={AUDIT_CHECK.name: never})
    assert status.checks[AUDIT_CHECK.name]["evaluated_at"] is None
    assert status.checks[AUDIT_CHECK.name]["stale"] is False


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
        (  # expiry removed the cursor and the commits after it before they were recounted
            PipelineAudit(CommitAudit(cursor=None, recounted=[9], cursor_expired=7)),
            "failed",
            "were expired before the audit recounted them",
        ),
        (  # ... but a full audit verified every row
            PipelineAudit(CommitAudit(recounted=[9], cursor_expired=7), AuditResult(rows=5)),
            "passed",
            "1 commit(s) recounted",
        ),
    ],
    ids=[
        "no-table",
        "clean",
        "not-verifiable",
        "duplicate",
        "count-mismatch",
        "cursor-expired",
        "cursor-expired-full-audit",
    ],
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


HOUR_MS = 3_600_000


@pytest.mark.parametrize(
    ("current", "passed", "severity", "text"),
    [
        (state({0: 4}, commits=[commit(120)]), False, "ERROR", "the oldest for 120 s"),
        (state({0: 4}, commits=[commit(30)]), True, "ERROR", "the oldest 30 s old"),
        (
            # the last commit planned 200 s ago (its valid-through): the record arrived later
            state({0: 4}, commits=[commit(30, valid_through_s=200)]),
            False,
            "ERROR",
            "the oldest for 200 s",
        ),
        (state(None), False, "WARN", "never committed, so how long they have waited is unknown"),
    ],
    ids=["stale", "recent-commit", "valid-through", "never-committed"],
)
def test_a_future_producer_timestamp_is_not_trusted(
    current: PipelineState, passed: bool, severity: str, text: str
) -> None:
    """R53: a record stamped an hour ahead would be -3600 s old; its age is bounded by the
    last commit instead (never fresh for ever), and the partition and offset are named."""
    current.oldest_uncommitted_ms = {("orders", 0): 1_000_000 + HOUR_MS}
    finding = check_commit_freshness(current, now_ms=1_000_000)
    assert (finding.passed, finding.severity) == (passed, severity), finding.message
    assert text in finding.message
    offset = 4 if current.committed else 0
    where = f"orders[0] offset {offset} (timestamp 3600 s in the future)"
    assert where in finding.message
    assert finding.metadata["future_timestamps"] == where


def test_a_small_clock_skew_is_trusted() -> None:
    """A timestamp within the skew allowance (ingestion.health.lag.FUTURE_SKEW_MS) is the
    record's."""
    current = state({0: 4}, commits=[commit(120)], oldest_uncommitted_ms={("orders", 0): 1_002_000})
    finding = check_commit_freshness(current, now_ms=1_000_000)
    assert finding.passed
    assert "future" not in finding.message


def test_status_and_sensor_share_the_lag_in_seconds() -> None:
    """``platform status`` shows the same bounded age as commit_freshness and the sensor
    (one function, ingestion.health.lag.measure_lag_age), per partition and overall."""
    from ingestion.health.lag import measure_with_sightings

    current = state(
        {0: 4, 1: 7},
        ends={0: 10, 1: 9},
        commits=[commit(45)],
        oldest_uncommitted_ms={("orders", 0): 1_000_000 + HOUR_MS, ("orders", 1): 990_000},
    )
    status = build_status(current, evaluate_state_checks(current), now_ms=1_000_000)
    ages = {p.partition: p.oldest_uncommitted_age_s for p in status.partitions}
    assert ages == {"orders:0": 45.0, "orders:1": 10.0}
    assert status.oldest_uncommitted_age_s == 45.0
    assert status.future_timestamps == "orders[0] offset 4 (timestamp 3600 s in the future)"
    sensor_age, seen = measure_with_sightings(current, 1_000_000, {})
    assert sensor_age.seconds == 45.0
    assert seen == {"orders[0]@4": 1_000_000}


def audit_with(**fields: Any) -> PipelineAudit:
    return PipelineAudit(CommitAudit(cursor=7, recounted=[7], **fields), budget=1000)


UNRECOUNTED = {
    "unrecounted_snapshot": 8,
    "unrecounted": "snapshot 8: could not recount orders[2] [10, 20) (broker down)",
    "pending": 2,
    "backlog_offsets": 30,
    "oldest_unaudited_ms": 1_000_000 - 60_000,
}


@pytest.mark.parametrize(
    ("previous", "severity", "attempts", "text"),
    [
        (None, "WARN", 1, "retried by the next evaluation (5 more before this fails)"),
        (AuditMemory(7, 8, 2), "WARN", 3, "3 evaluation(s) in a row"),
        (AuditMemory(7, 8, 5), "ERROR", 6, "the audit cannot move past it"),
        (AuditMemory(7, 6, 5), "WARN", 1, "1 evaluation(s) in a row"),  # another commit
    ],
    ids=["first", "again", "bound", "another-commit"],
)
def test_an_unrecountable_commit_warns_then_fails(
    previous: AuditMemory | None, severity: str, attempts: int, text: str
) -> None:
    """R47: the commit that could not be recounted is named (snapshot, topic[partition] and
    range); the cursor stays before it; the check fails after MAX_RECOUNT_ATTEMPTS."""
    finding = check_exactly_once("demo.orders", audit_with(**UNRECOUNTED), previous, 1_000_000)
    assert (finding.passed, finding.severity) == (False, severity)
    assert text in finding.message
    assert "snapshot 8: could not recount orders[2] [10, 20)" in finding.message
    assert finding.metadata["recount_attempts"] == attempts
    assert finding.metadata["unrecounted_snapshot"] == "8"
    assert finding.metadata["audit_cursor"] == "7"
    assert finding.metadata["backlog_commits"] == 2
    assert finding.metadata["oldest_unaudited_age_s"] == 60.0


@pytest.mark.parametrize(
    ("fields", "passed", "text"),
    [
        ({"pending": 1, "backlog_offsets": 500, "oldest_unaudited_ms": 900_000}, True, "left"),
        ({"pending": 3, "backlog_offsets": 1500, "oldest_unaudited_ms": 900_000}, False, "1500"),
        (
            {"pending": 1, "backlog_offsets": 10, "oldest_unaudited_ms": 1_000_000 - 1801_000},
            False,
            "the oldest 1801 s old",
        ),
    ],
    ids=["small", "over-budget", "too-old"],
)
def test_the_audit_backlog_is_reported_and_bounded(
    fields: dict[str, Any], passed: bool, text: str
) -> None:
    """R47: commits left by the budget are the backlog (metadata); it WARNs when one
    evaluation's budget cannot clear it, or its oldest commit is older than the bound."""
    finding = check_exactly_once("demo.orders", audit_with(**fields), None, 1_000_000)
    assert finding.passed is passed, finding.message
    assert not finding.blocks
    assert text in finding.message
    assert finding.metadata["backlog_commits"] == fields["pending"]
    assert finding.metadata["backlog_offsets"] == fields["backlog_offsets"]
    if not passed:
        assert "the audit is falling behind" in finding.message
