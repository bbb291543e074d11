"""The stream sensor's decisions (``plan_workers``) on a real (ephemeral) Dagster instance:
workers started per shard with their assignment, an assignment rewritten in place when a
pipeline comes or goes, a worker of other code asked to stop and a dead one marked failed, a
held pipeline left out, the per-pipeline stream runs of earlier releases stopped, and one
alert per failing lane and cause; a worker being terminated (CANCELING) holding its shard until
it ended or stopped beating."""

from __future__ import annotations

import json
import time
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    build_sensor_context,
    instance_for_test,
)

from platform_assets.ingest.jobs import OPERATOR_TAG
from platform_assets.streaming.jobs import (
    ASSIGNED_TAG,
    FAILURES_TAG,
    GENERATION_TAG,
    HEARTBEAT_TAG,
    SERVING_TAG,
    SHARD_TAG,
    STOP_TAG,
    STREAM_JOB,
    active_stream_runs,
    shard_of,
    spec_version,
)
from platform_assets.streaming.sensors import (
    alert_lane_failures,
    build_stream_sensor,
    plan_workers,
)
from resources.alerts import Alert, AlertResource
from tests.support.pipelines import make_spec

SPECS = [make_spec(f"t{i}", f"sup{i}", freshness_target_seconds=15) for i in range(6)]


def add_worker(
    instance: DagsterInstance, shard: str, beat: float, generation: str, **tags: str
) -> str:
    run = DagsterRun(
        job_name=STREAM_JOB,
        status=DagsterRunStatus.STARTED,
        tags={SHARD_TAG: shard, HEARTBEAT_TAG: str(int(beat)), GENERATION_TAG: generation, **tags},
    )
    instance.add_run(run)
    return run.run_id


def tags_of(instance: DagsterInstance, run_id: str) -> dict[str, str]:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return dict(run.tags)


def test_one_worker_per_shard_is_started_with_its_pipelines() -> None:
    with DagsterInstance.ephemeral() as instance:
        plan = plan_workers(instance, SPECS, "g1", 2, time.time())
        assigned: dict[str, str] = {}
        shards = set()
        for request in plan.requests:
            assert request.tags[GENERATION_TAG] == "g1"
            shard = int(request.tags[SHARD_TAG].split("/")[0])
            shards.add(shard)
            batch = json.loads(request.tags[ASSIGNED_TAG])
            assert all(shard_of(name, 2) == shard for name in batch)
            assigned.update(batch)
        assert assigned == {spec.name: spec_version(spec) for spec in SPECS}
        assert len(plan.requests) == len(shards) <= 2  # runs do not grow with pipelines
        assert not plan_workers(instance, [], "g1", 2, time.time()).requests


def test_a_live_worker_is_reassigned_in_place_and_other_code_is_stopped() -> None:
    with DagsterInstance.ephemeral() as instance:
        now = time.time()
        live = add_worker(instance, "0/1", now, "g1", **{ASSIGNED_TAG: "{}"})
        plan = plan_workers(instance, SPECS[:2], "g1", 1, now)
        assert not plan.requests  # the live worker serves them: no second run
        assert json.loads(tags_of(instance, live)[ASSIGNED_TAG]) == {
            spec.name: spec_version(spec) for spec in SPECS[:2]
        }
        # A pipeline added: the same worker, its assignment grows; nothing is restarted.
        plan_workers(instance, SPECS[:3], "g1", 1, now)
        assert len(json.loads(tags_of(instance, live)[ASSIGNED_TAG])) == 3
        assert STOP_TAG not in tags_of(instance, live)
        # New code: the worker is asked to stop, and no successor starts until it has ended.
        plan = plan_workers(instance, SPECS[:3], "g2", 1, now)
        assert "code" in tags_of(instance, live)[STOP_TAG]
        assert not plan.requests
        instance.report_run_failed(instance.get_run_by_id(live), message="ended")  # type: ignore[arg-type]
        plan = plan_workers(instance, SPECS[:3], "g2", 1, time.time() + 60)
        assert len(plan.requests) == 1


def test_of_two_workers_of_one_shard_the_younger_is_stopped() -> None:
    """A failed worker re-executed from the UI, or a manual launch, carries the shard's tags:
    two workers would stream every pipeline twice (the compare-and-set keeps the data right,
    at the price of constant re-plans). The older keeps the shard."""
    with DagsterInstance.ephemeral() as instance:
        now = time.time()
        older = add_worker(instance, "0/1", now, "g1")
        younger = add_worker(instance, "0/1", now, "g1")
        plan = plan_workers(instance, SPECS[:2], "g1", 1, now)
        assert not plan.requests
        assert STOP_TAG not in tags_of(instance, older)
        assert "another worker already serves shard 0/1" in tags_of(instance, younger)[STOP_TAG]


def test_a_dead_worker_is_marked_failed_and_replaced_after_the_backoff() -> None:
    with DagsterInstance.ephemeral() as instance:
        now = time.time()
        dead = add_worker(instance, "0/1", now - 600, "g1")
        plan = plan_workers(instance, SPECS[:1], "g1", 1, now)
        run = instance.get_run_by_id(dead)
        assert run is not None
        assert run.status == DagsterRunStatus.FAILURE
        assert not plan.requests
        assert any("failed" in line and "s ago" in line for line in plan.lines), plan.lines
        assert len(plan_workers(instance, SPECS[:1], "g1", 1, time.time() + 60).requests) == 1


def test_a_held_pipeline_is_left_out_of_the_assignment_alone() -> None:
    with DagsterInstance.ephemeral() as instance:
        now = time.time()
        serving = {spec.name: spec_version(spec) for spec in SPECS[:2]}
        live = add_worker(instance, "0/1", now, "g1", **{ASSIGNED_TAG: json.dumps(serving)})
        operator = DagsterRun(
            job_name="reset_offsets",
            status=DagsterRunStatus.STARTED,
            tags={OPERATOR_TAG: SPECS[0].name},
        )
        instance.add_run(operator)
        plan = plan_workers(instance, SPECS[:2], "g1", 1, now)
        assert json.loads(tags_of(instance, live)[ASSIGNED_TAG]) == {
            SPECS[1].name: spec_version(SPECS[1])
        }
        assert f"operator action in progress (run {operator.run_id})" in "; ".join(plan.lines)


def test_active_stream_runs_are_the_workers_serving_the_pipeline() -> None:
    with DagsterInstance.ephemeral() as instance:
        now = time.time()
        one, two = SPECS[:2]
        add_worker(instance, "0/1", now, "g1", **{"stream/serving": json.dumps({one.name: "v"})})
        assert len(active_stream_runs(instance, one)) == 1
        assert active_stream_runs(instance, two) == []  # assigned is not serving once started


def test_stream_runs_of_the_per_pipeline_jobs_of_earlier_releases_are_stopped() -> None:
    with DagsterInstance.ephemeral() as instance:
        now = time.time()
        old = DagsterRun(
            job_name="stream_sup0_job",
            status=DagsterRunStatus.STARTED,
            tags={"pipeline": "sup0", HEARTBEAT_TAG: str(int(now))},
        )
        instance.add_run(old)
        plan = plan_workers(instance, SPECS[:1], "g1", 1, now)
        assert "shared stream worker" in tags_of(instance, old.run_id)[STOP_TAG]
        assert any(old.run_id in line for line in plan.lines)


class Recorded(AlertResource):
    """The real alert resource (log sink only), keeping what it sent for the assertions."""

    def model_post_init(self, context: Any) -> None:
        object.__setattr__(self, "_sent", [])

    def send(self, alert: Alert) -> list[str]:
        self._sent.append(alert)  # type: ignore[attr-defined]
        return super().send(alert)


def test_a_failing_lane_alerts_once_per_pipeline_and_cause() -> None:
    alerts = Recorded()
    failures = {"sup0": ("run-1", "TopicNotFoundError: no topic t0")}
    alerted = alert_lane_failures(failures, {}, alerts)
    alerted = alert_lane_failures(failures, alerted, alerts)  # still failing: no repeat
    sent = alerts._sent  # type: ignore[attr-defined]
    assert [a.kind for a in sent] == ["stream_failed"]
    assert "sup0" in sent[0].title
    assert "other pipelines keep streaming" in sent[0].message
    again = {"sup0": ("run-2", "TopicNotFoundError: no topic t0 (attempt 2 in stage 57.0)")}
    retried = {"sup0": ("run-1", "TopicNotFoundError: no topic t0 (attempt 3 in stage 61.0)")}
    alerted = alert_lane_failures(again, alerted, alerts)  # a new cause: alerted
    alerted = alert_lane_failures(retried, alerted, alerts)  # the same up to numbers: not
    assert len(sent) == 2
    alerted = alert_lane_failures({}, alerted, alerts)  # it committed again: cleared
    alert_lane_failures(failures, alerted, alerts)
    assert len(sent) == 3
    assert FAILURES_TAG == "stream/failures"


def canceling_worker(instance: DagsterInstance, shard: str, beat: float, **tags: str) -> str:
    """A worker whose termination was requested (Terminate in the UI, ``make dev`` stopping):
    CANCELING until its process has stopped its lanes."""
    run_id = add_worker(instance, shard, beat, "g1", **tags)
    instance.report_run_canceling(instance.get_run_by_id(run_id), message="test: terminate")  # type: ignore[arg-type]
    assert status_of(instance, run_id) == DagsterRunStatus.CANCELING
    return run_id


def status_of(instance: DagsterInstance, run_id: str) -> DagsterRunStatus:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return run.status


def stream_tick(instance: DagsterInstance, specs: list[Any], workers: int = 1) -> Any:
    """One tick of the real stream sensor on ``instance``."""
    sensor = build_stream_sensor(specs, "g1", workers)
    context = build_sensor_context(instance=instance, resources={"alerts": AlertResource()})
    return sensor.evaluate_tick(context)


def test_a_canceling_worker_keeps_its_shard_until_it_ended() -> None:
    """A worker being terminated may still commit until its lanes stopped (up to its stop
    timeout): no second worker for its lanes meanwhile; once it ended, its successor starts."""
    with instance_for_test() as instance:
        serving = json.dumps({SPECS[0].name: spec_version(SPECS[0])})
        stopping = canceling_worker(instance, "0/1", time.time(), **{SERVING_TAG: serving})
        held = stream_tick(instance, SPECS[:2])
        assert not held.run_requests
        assert f"stream worker {stopping} is terminating (CANCELING)" in (held.skip_message or "")
        assert STOP_TAG not in tags_of(instance, stopping)  # it is stopping already
        assert active_stream_runs(instance, SPECS[0])  # its lane may still commit
        instance.report_run_canceled(instance.get_run_by_id(stopping), message="test: ended")  # type: ignore[arg-type]
        (request,) = stream_tick(instance, SPECS[:2]).run_requests
        assert request.tags[SHARD_TAG] == "0/1"


def test_a_canceling_worker_holds_the_shards_of_its_lanes_under_another_worker_count() -> None:
    """A worker of another ``streaming.workers`` holds the new shard of every pipeline it still
    serves; a successor started before it was terminated keeps streaming (it is not asked to
    stop as a second worker of the shard)."""
    with instance_for_test() as instance:
        now = time.time()
        serving = json.dumps({SPECS[0].name: spec_version(SPECS[0])})
        canceling_worker(instance, "0/2", now, **{SERVING_TAG: serving})
        home = shard_of(SPECS[0].name, 3)
        others = {shard_of(spec.name, 3) for spec in SPECS} - {home}
        assert others  # the pipelines span more shards than the one held
        plan = plan_workers(instance, SPECS, "g1", 3, now)
        assert sorted(r.tags[SHARD_TAG] for r in plan.requests) == [
            f"{s}/3" for s in sorted(others)
        ]
    with instance_for_test() as instance:
        canceling_worker(instance, "0/1", now)
        successor = add_worker(instance, "0/1", now, "g1")
        assert not plan_workers(instance, SPECS[:2], "g1", 1, now).requests
        assert STOP_TAG not in tags_of(instance, successor)


def test_a_canceling_worker_that_stopped_beating_is_marked_failed_and_replaced() -> None:
    """Without run monitoring, a worker killed while it stopped stays CANCELING for ever: its
    heartbeat stops (a stopping worker beats on), so the sensor judges it as a STARTED one and
    its shard is served again after the backoff."""
    with instance_for_test() as instance:
        now = time.time()
        dead = canceling_worker(instance, "0/1", now - 600)
        alive = canceling_worker(instance, "0/2", now)  # still beating: left alone
        held = stream_tick(instance, SPECS[:1])
        assert status_of(instance, dead) == DagsterRunStatus.FAILURE
        assert status_of(instance, alive) == DagsterRunStatus.CANCELING
        assert f"marked stream worker {dead} failed (no heartbeat)" in (held.skip_message or "")
        assert not held.run_requests  # the restart backoff
        (request,) = plan_workers(instance, SPECS[:1], "g1", 1, time.time() + 60).requests
        assert request.tags[SHARD_TAG] == "0/1"
