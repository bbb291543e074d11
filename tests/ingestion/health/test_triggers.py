"""The lag sensor's decisions as pure functions: when a pipeline streams, how often a stream
commits, the record age that launches a run, whether to request a run for the lag, and, while
the blocking group check fails, for that check (at most one run per cause)."""

from __future__ import annotations

import pytest

from ingestion.health.checks import Finding, failed, passed
from ingestion.health.triggers import (
    RUN_PER_COMMIT_FLOOR_SECONDS,
    commit_interval_seconds,
    decide,
    decide_group_check,
    is_continuous,
    max_lag_age_seconds,
)
from tests.support.pipelines import make_spec


@pytest.mark.parametrize(
    ("target", "continuous", "interval", "age"),
    [
        (None, False, 7.5, 300),  # no target: max_lag_seconds (default 300)
        (2, True, 1.0, 1),  # a quarter of 2 s is below the 1 s floor; the age at least 1 s
        (15, True, 3.75, 1),
        (RUN_PER_COMMIT_FLOOR_SECONDS - 1, True, 7.25, 1),
        (RUN_PER_COMMIT_FLOOR_SECONDS, False, 7.5, 1),  # at the floor: runs per commit
        (31, False, 7.75, 1),
        (300, False, 15.0, 270),  # the interval is capped at 15 s
    ],
)
def test_a_freshness_target_below_the_floor_streams_and_above_it_sets_the_age_trigger(
    target: int | None, continuous: bool, interval: float, age: int
) -> None:
    spec = make_spec("t", "trig", freshness_target_seconds=target)
    assert is_continuous(spec) is continuous
    assert commit_interval_seconds(spec) == interval
    assert max_lag_age_seconds(spec) == age


SPEC = make_spec("t", "trig", max_lag_records=100, max_lag_seconds=60)


@pytest.mark.parametrize(
    ("lag", "age", "busy", "run", "why"),
    [
        (0, 500.0, False, False, "idle: no uncommitted records"),
        (150, 1.0, True, False, "lag 150: a run of 'trig' is already queued or running"),
        (100, None, False, True, "lag 100 >= 100 records"),
        (5, 60.0, False, True, "oldest uncommitted record is 60 s old >= 60 s"),
        (5, None, False, False, "lag 5 < 100 records and 0 s < 60 s"),  # age unread: lag only
        (99, 59.4, False, False, "lag 99 < 100 records and 59 s < 60 s"),
    ],
)
def test_a_run_is_requested_at_the_record_or_age_threshold_unless_one_is_busy(
    lag: int, age: float | None, busy: bool, run: bool, why: str
) -> None:
    assert decide(lag, age, SPEC, busy) == (run, why)


BLOCKED = failed("ERROR", "table holds offsets under ['a'] but none under 'b'")
OTHER_CAUSE = failed("ERROR", "Kafka group 'b' has active members (STABLE)")
PASSED = passed("group ids agree ('a'); no foreign members")
BEHIND = failed("WARN", "mirror is behind")


@pytest.mark.parametrize(
    ("now", "latest", "requested", "busy", "expected"),
    [
        pytest.param(PASSED, PASSED, None, False, False, id="healthy"),
        pytest.param(PASSED, None, None, False, False, id="healthy, never evaluated"),
        pytest.param(BEHIND, PASSED, None, False, False, id="a warning leaves it to the runs"),
        pytest.param(BLOCKED, PASSED, None, False, True, id="newly blocked: one run"),
        pytest.param(BLOCKED, None, None, False, True, id="blocked, never evaluated"),
        pytest.param(BLOCKED, PASSED, None, True, False, id="a run in flight evaluates it"),
        pytest.param(
            BLOCKED, PASSED, BLOCKED.fingerprint, False, False, id="already requested: no storm"
        ),
        pytest.param(BLOCKED, BLOCKED, None, False, False, id="a blocked run already said it"),
        pytest.param(OTHER_CAUSE, BLOCKED, BLOCKED.fingerprint, False, True, id="a new cause"),
        pytest.param(PASSED, BLOCKED, BLOCKED.fingerprint, False, True, id="fixed: record it"),
        pytest.param(PASSED, BLOCKED, PASSED.fingerprint, False, False, id="fix requested"),
        pytest.param(BEHIND, BLOCKED, None, False, True, id="fixed to a warning: record it"),
    ],
)
def test_lag_sensor_group_check_decision(
    now: Finding, latest: Finding | None, requested: str | None, busy: bool, expected: bool
) -> None:
    assert decide_group_check(now, latest, requested, busy)[0] is expected
