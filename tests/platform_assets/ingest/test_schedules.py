"""The schedules of every pipeline (pure definitions and a Dagster instance, no Kafka): one
fallback schedule per distinct cron and one maintenance schedule per cadence, however many
pipelines; a maintenance schedule skips while its previous run may be alive."""

from __future__ import annotations

from dagster import DagsterRun, DagsterRunStatus, ScheduleDefinition, instance_for_test

from ingestion.ops.retention import DAILY_MAINTENANCE_CRON, FREQUENT_MAINTENANCE_CRON
from platform_assets.ingest.jobs import build_ingest_all_job
from platform_assets.ingest.schedules import (
    active_maintenance,
    build_fallback_schedules,
    build_maintenance_schedules,
    schedule_suffix,
)
from platform_assets.operations.jobs import MAINTAIN_JOB
from tests.support.pipelines import make_spec


def test_one_fallback_schedule_per_cron_and_one_maintenance_schedule_per_cadence() -> None:
    specs = [
        make_spec("a", "sched_a"),
        make_spec("b", "sched_b", fallback_cron="0 * * * *"),
        make_spec("c", "sched_c"),
        make_spec("d", "sched_d", freshness_target_seconds=4),
    ]
    fallbacks = {s.name: s for s in build_fallback_schedules(specs, build_ingest_all_job(specs))}
    hourly = f"fallback_schedule_{schedule_suffix('0 * * * *')}"
    assert set(fallbacks) == {"fallback_schedule", hourly}
    assert {s.job_name for s in fallbacks.values()} == {"ingest_all"}
    assert "sched_a, sched_c, sched_d" in (fallbacks["fallback_schedule"].description or "")
    maintenance = {
        s.name: s.cron_schedule
        for s in build_maintenance_schedules(specs)
        if isinstance(s, ScheduleDefinition)
    }
    assert maintenance == {
        "maintenance_schedule": FREQUENT_MAINTENANCE_CRON,
        "daily_maintenance_schedule": DAILY_MAINTENANCE_CRON,
    }


def test_a_maintenance_schedule_waits_for_its_own_run_only() -> None:
    with instance_for_test() as instance:

        def add(trigger: str, status: DagsterRunStatus) -> DagsterRun:
            return instance.add_run(
                DagsterRun(job_name=MAINTAIN_JOB, status=status, tags={"trigger": trigger})
            )

        assert active_maintenance(instance, "maintenance_schedule") is None
        add("daily_maintenance_schedule", DagsterRunStatus.STARTED)  # another schedule's
        assert active_maintenance(instance, "maintenance_schedule") is None
        add("maintenance_schedule", DagsterRunStatus.SUCCESS)  # ended
        assert active_maintenance(instance, "maintenance_schedule") is None
        mine = add("maintenance_schedule", DagsterRunStatus.STARTED)  # no process recorded
        assert active_maintenance(instance, "maintenance_schedule") == mine.run_id  # may be alive
