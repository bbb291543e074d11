"""The alert noise budget and the blocked state, as pure functions (the lag sensor's decision
while blocked: tests/ingestion/health/test_triggers.py)."""

from __future__ import annotations

import pytest

from ingestion.health.checks import check_group_consistency
from ingestion.health.state import PipelineState
from platform_assets.alerts.policy import (
    Evaluation,
    apply_evaluations,
    cause_key,
    dump_cursor,
    failed_only_because_blocked,
    load_cursor,
)
from tests.support.pipelines import make_spec

HOUR = 3600.0
GROUP = "group_id_consistency"


def ev(
    check: str = GROUP,
    status: str = "ok",
    at: float = 0.0,
    message: str = "",
    blocked_by: str = "",
) -> Evaluation:
    """An evaluation of ``check`` on table t: ``ok``, ``WARN`` or ``ERROR``."""
    return Evaluation(
        asset="iceberg/t",
        check=check,
        passed=status == "ok",
        severity="ERROR" if status == "ok" else status,
        message=message or f"{check} {status}",
        timestamp=at,
        run_id=f"run-{at:.0f}",
        blocking=check == GROUP,
        blocked_by=blocked_by,
    )


def kinds(evaluations: list[Evaluation], now: float = 1000.0, reminder_s: float = 0.0) -> list:
    return [(n.kind, n.check) for n in apply_evaluations({}, evaluations, now, reminder_s)[1]]


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        pytest.param(["ok", "ok", "ok"], [], id="healthy: silent"),
        pytest.param(["ERROR"], ["check_failed"], id="first seen failing: one FAILED"),
        pytest.param(["ok", "ERROR"], ["check_failed"], id="ok->fail: FAILED"),
        pytest.param(
            ["ok"] + ["ERROR"] * 20, ["check_failed"], id="storm of failing evaluations: one"
        ),
        pytest.param(
            ["ERROR", "ERROR", "ok", "ok"],
            ["check_failed", "check_recovered"],
            id="fail->ok: one RECOVERED",
        ),
        pytest.param(
            ["ERROR", "ok", "ERROR", "ok"],
            ["check_failed", "check_recovered", "check_failed", "check_recovered"],
            id="each state change alerts once",
        ),
        pytest.param(
            ["WARN", "WARN", "ERROR", "ERROR"],
            ["check_failed", "check_failed"],
            id="escalation WARN->ERROR is a new state",
        ),
        pytest.param(["ok", "WARN", "ok"], ["check_failed", "check_recovered"], id="warnings too"),
    ],
)
def test_one_alert_per_state_change(sequence: list[str], expected: list[str]) -> None:
    evaluations = [ev(status=s, at=float(i)) for i, s in enumerate(sequence)]
    assert [kind for kind, _ in kinds(evaluations)] == expected


def test_same_cause_new_message_is_no_new_alert_and_the_state_keeps_the_newest() -> None:
    states, notices = apply_evaluations(
        {}, [ev(status="ERROR", message="a"), ev(status="ERROR", at=5, message="b")], 10, 0
    )
    assert len(notices) == 1
    state = states[f"iceberg/t / {GROUP}"]
    assert (state["message"], state["since"], state["alerted_at"]) == ("b", 0.0, 10)


@pytest.mark.parametrize(
    ("blocked_by", "expected"),
    [
        pytest.param(GROUP, [("check_failed", GROUP), ("check_recovered", GROUP)], id="blocked"),
        pytest.param(
            "",
            [
                ("check_failed", "commit_freshness"),
                ("check_failed", GROUP),
                ("check_recovered", GROUP),
                ("check_recovered", "commit_freshness"),
            ],
            id="a real failure of its own still alerts",
        ),
    ],
)
def test_checks_not_evaluated_while_blocked_never_alert(
    blocked_by: str, expected: list[tuple[str, str]]
) -> None:
    """The docs/alerts.md procedure: one FAILED and one RECOVERED, whatever the other checks said
    while the pipeline was blocked (run_checks may even evaluate them before the group check)."""
    sequence = [
        ev("commit_freshness", "ok", 0),
        ev("commit_freshness", "WARN", 1, blocked_by=blocked_by),  # before the group check
        ev(GROUP, "ERROR", 2),
        ev("offsets_watermark_reachable", "WARN", 3, blocked_by=GROUP),
        ev("exactly_once_audit", "WARN", 3, blocked_by=GROUP),
        ev(GROUP, "ok", 4),
        ev("commit_freshness", "ok", 5),
        ev("offsets_watermark_reachable", "ok", 5),
        ev("exactly_once_audit", "ok", 5),
    ]
    assert kinds(sequence) == expected


@pytest.mark.parametrize(
    ("reminder_s", "now", "expected"),
    [
        pytest.param(0, 100 * HOUR, [], id="reminders off"),
        pytest.param(6 * HOUR, 5 * HOUR, [], id="before the reminder"),
        pytest.param(6 * HOUR, 6 * HOUR, ["check_still_failing"], id="at the reminder"),
    ],
)
def test_reminder_while_still_failing(reminder_s: float, now: float, expected: list[str]) -> None:
    states, first = apply_evaluations({}, [ev(status="ERROR")], 0.0, reminder_s)
    assert [n.kind for n in first] == ["check_failed"]
    states, later = apply_evaluations(states, [ev(status="ERROR", at=now - 1)], now, reminder_s)
    assert [n.kind for n in later] == expected
    if expected:  # the next reminder is one period later, not every tick
        assert apply_evaluations(states, [], now + 60, reminder_s)[1] == []
        assert len(apply_evaluations(states, [], now + reminder_s, reminder_s)[1]) == 1


def test_recovered_says_since_when_it_failed() -> None:
    states, _ = apply_evaluations({}, [ev(status="WARN", at=10), ev(status="ERROR", at=20)], 30, 0)
    _, (notice,) = apply_evaluations(states, [ev(status="ok", at=50)], 60, 0)
    assert (notice.kind, notice.failing_since) == ("check_recovered", 10)


def test_cursor_round_trip_and_upgrade_from_the_earlier_sensor() -> None:
    states, _ = apply_evaluations({}, [ev(status="ERROR")], 1.0, 0)
    read = {f"iceberg/t / {GROUP}": 0.0}
    assert load_cursor(dump_cursor(read, states), 2.0) == (read, states)
    read_back, legacy = load_cursor('{"iceberg/t / group_id_consistency": {"passed": false}}', 9)
    assert read_back is None
    # already alerted by the earlier sensor: a further failure is no new alert
    assert apply_evaluations(legacy, [ev(status="ERROR", at=10)], 11, 0)[1] == []


@pytest.mark.parametrize(
    ("failed", "blocked", "expected"),
    [
        ({"ingest_orders"}, {"ingest_orders"}, True),
        ({"ingest_orders"}, set(), False),
        ({"ingest_orders", "ingest_clicks"}, {"ingest_orders"}, False),
        (set(), set(), False),
    ],
)
def test_run_failure_left_to_the_check_only_when_blocked(
    failed: set[str], blocked: set[str], expected: bool
) -> None:
    assert failed_only_because_blocked(failed, blocked) is expected


@pytest.mark.parametrize(
    ("consumer", "other_groups", "blocks"),
    [
        ("connect-sink-group", {"platform-orders"}, True),  # docs/alerts.md's seed
        ("platform-orders", set(), False),
    ],
)
def test_the_seed_state_blocks_with_a_stable_fingerprint(
    consumer: str, other_groups: set[str], blocks: bool
) -> None:
    spec = make_spec("orders", "orders", consumer_group_id=consumer)
    outcomes = []
    for read_at in (1, 2):  # two reads of the same state, a tick apart
        state = PipelineState(spec, table_exists=True, table_has_rows=True, read_at_ms=read_at)
        state.other_groups = set(other_groups)
        finding = check_group_consistency(state)
        outcomes.append(finding)
    assert outcomes[0].blocks is blocks
    assert outcomes[0].fingerprint == outcomes[1].fingerprint


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        (
            ["ingest_orders: offset 17 below log start 40 of orders[2]"],
            ["ingest_orders: offset 90 below log start 120 of orders[2]"],
            True,
        ),
        (
            ["ingest_orders: commit 4f2a9c01e0 lost to 77bb0e1342"],
            ["ingest_orders: commit 0a9f3b2c11 lost to 12cd34ef56"],
            True,
        ),
        (["ingest_orders: table demo.orders was dropped"], ["ingest_orders: broker down"], False),
        (["a: x", "b: y"], ["b: y", "a: x"], True),
    ],
    ids=["offsets-differ", "ids-differ", "other-cause", "step-order"],
)
def test_a_repeated_run_failure_has_one_cause_key(
    first: list[str], second: list[str], same: bool
) -> None:
    """run_failure_alerts alerts once per cause: a run failing like the run before it is not
    alerted again (the key ignores offsets, partitions and ids)."""
    assert (cause_key(first) == cause_key(second)) is same
