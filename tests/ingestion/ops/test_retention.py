"""How long a pipeline keeps its table's history and when its maintenance runs (pure): a
stream keeps a budget of commits at its interval, a run-per-commit pipeline with a target a
budget at the interval its trigger allows (at most a week), any other a week; maintenance every
15 minutes for the first two, daily otherwise, at a minute that spreads pipelines apart."""

from __future__ import annotations

import itertools

import pytest

from ingestion.health.triggers import commit_interval_seconds
from ingestion.ops.retention import (
    BATCH_SNAPSHOT_RETENTION_HOURS,
    DAILY_MAINTENANCE_CRON,
    FREQUENT_MAINTENANCE_CRON,
    MAX_ORPHAN_WINDOW_HOURS,
    RUN_SNAPSHOT_BUDGET,
    STREAM_SNAPSHOT_BUDGET,
    maintenance_cron,
    orphan_window_hours,
    snapshot_retention_hours,
)
from tests.support.pipelines import make_spec


@pytest.mark.parametrize("target", [1, 4, 15, 29])
def test_a_stream_keeps_its_snapshot_budget_at_its_commit_interval(target: int) -> None:
    spec = make_spec("t", "s", freshness_target_seconds=target)
    span_s = STREAM_SNAPSHOT_BUDGET * commit_interval_seconds(spec)
    assert snapshot_retention_hours(spec) * 3600 == pytest.approx(span_s, abs=18)  # 0.01 h


@pytest.mark.parametrize(("target", "hours"), [(30, 4.17), (45, 4.17), (60, 8.33), (900, 168.0)])
def test_a_run_per_commit_target_keeps_its_budget_at_the_shortest_interval_at_most_a_week(
    target: int, hours: float
) -> None:
    """The interval is the target less the run floor, never below the sensor's 15 s tick."""
    assert snapshot_retention_hours(make_spec("t", "r", freshness_target_seconds=target)) == hours
    assert pytest.approx(4.17, abs=0.01) == RUN_SNAPSHOT_BUDGET * 15 / 3600


def test_the_spec_overrides_and_the_default_is_a_week() -> None:
    assert snapshot_retention_hours(make_spec("t", "d")) == BATCH_SNAPSHOT_RETENTION_HOURS == 168
    stream = make_spec("t", "o", freshness_target_seconds=4, snapshot_retention_hours=2)
    assert snapshot_retention_hours(stream) == 2.0


@pytest.mark.parametrize("target", [None, 4, 300])
def test_the_orphan_window_is_72_hours_whatever_the_retention(target: int | None) -> None:
    spec = make_spec("t", "w", freshness_target_seconds=target)
    assert orphan_window_hours(spec) == MAX_ORPHAN_WINDOW_HOURS == 72.0


def test_maintenance_runs_every_quarter_hour_with_a_target_and_daily_without() -> None:
    """Two crons, whatever the names: the pipelines on one are maintained in one run, one
    after the other (``maintenance_schedule``, ``daily_maintenance_schedule``)."""
    for name in [f"pipeline{i}" for i in range(30)]:
        assert maintenance_cron(make_spec("t", name)) == DAILY_MAINTENANCE_CRON
        for target in (5, 60):
            quarterly = maintenance_cron(make_spec("t", name, freshness_target_seconds=target))
            assert quarterly == FREQUENT_MAINTENANCE_CRON
    minutes = [int(m) for m in FREQUENT_MAINTENANCE_CRON.split()[0].split(",")]
    assert [b - a for a, b in itertools.pairwise(minutes)] == [15, 15, 15]
    assert all(m % 15 for m in minutes)  # not on a fallback schedule's default quarter hours
