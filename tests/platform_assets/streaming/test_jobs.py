"""Day 2 of a stream (R52) on the real stack and a real Dagster instance: the pipeline's
maintenance schedule runs beside a live stream and expires its history keeping the watermark;
a stream run (the real ``stream_<p>_job``) marked failed stops itself; a stream run whose
pipeline no longer streams is stopped by ``stop_retired_streams``. Judged by the oracle."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    RunsFilter,
    build_schedule_context,
    build_sensor_context,
    instance_for_test,
)

from ingestion.health.state import commits_of
from ingestion.health.triggers import commit_interval_seconds
from ingestion.pipeline.run import RunReport
from ingestion.pipeline.stream import stream_pipeline
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import find_committed_state
from platform_assets.definitions import build_definitions
from platform_assets.operations.jobs import MAINTAIN_JOB, build_ops_jobs
from platform_assets.streaming.jobs import (
    GENERATION_TAG,
    HEARTBEAT_TAG,
    STOP_TAG,
    Heartbeat,
    active_stream_runs,
    beating,
    build_stream_job,
    is_stale,
    stream_job_name,
)
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, NewPipeline, records

pytestmark = pytest.mark.integration


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 90) -> Any:
    """Poll ``condition`` until it is truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


@contextmanager
def stream_run(
    spec: PipelineSpec, resources: dict[str, Any], instance: DagsterInstance
) -> Iterator[tuple[DagsterRun, threading.Thread, list[str]]]:
    """Run ``stream_<p>_job`` in a thread on ``instance`` (a real run: STARTED, heartbeats,
    the stop tag); yield (run, thread, the op's log messages once it ended). A stream still
    alive on exit is asked to stop, so a failing test never leaves it running."""
    job = build_stream_job(spec)
    messages: list[str] = []

    def execute() -> None:
        result = job.execute_in_process(
            instance=instance, resources=resources, tags={GENERATION_TAG: "test"},
            raise_on_error=False,
        )  # fmt: skip
        messages.extend(record.user_message for record in instance.all_logs(result.run_id))

    thread = threading.Thread(target=execute, daemon=True)
    thread.start()
    run = wait_for(
        lambda: next(iter(active_stream_runs(instance, spec)), None), "the stream run to start"
    )
    try:
        yield run, thread, messages
    finally:
        if thread.is_alive():
            instance.add_run_tags(run.run_id, {STOP_TAG: "test cleanup"})
            thread.join(60)


# Dagster's local compute-log capture tails stdout/stderr with `tail -F` subprocesses; in one
# full-suite run (not alone) their teardown hung 2 x 30 s after the stream had stopped, keeping
# the run's thread alive past the joins below. These tests are about the stream stopping, not
# about log capture: their instances keep run and event storage, without compute logs.
NO_COMPUTE_LOGS = {
    "compute_logs": {
        "module": "dagster._core.storage.noop_compute_log_manager",
        "class": "NoOpComputeLogManager",
    }
}


def commit_count(harness: Harness, spec: PipelineSpec) -> int:
    """The pipeline's commits still in the table's history (0 before the table exists)."""
    if not harness.catalog.table_exists(spec.table):
        return 0
    return len(commits_of(harness.table(spec), spec.consumer_group_id))


def test_maintenance_schedule_expires_a_streams_history_while_it_streams(
    harness: Harness,
    resources: dict[str, Any],
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
) -> None:
    """The per-pipeline schedule requests ``maintain_tables`` while the stream run holds the
    pipeline's pool (the job takes no pool, so it is not queued behind the stream); its run
    compacts and expires the old snapshots while the stream keeps committing, keeps the
    watermark, and every record lands exactly once."""
    topic, spec = new_pipeline(
        "stream_maint",
        partitions=2,
        produce=20,
        freshness_target_seconds=4,
        snapshot_retention_hours=0.002,  # 7.2 s: the test cannot wait for the default
        max_records_per_task=10,
    )
    schedule = build_definitions([spec]).resolve_schedule_def("stream_maint_maintenance_schedule")
    iceberg = {"iceberg": resources["iceberg"]}
    with instance_for_test() as instance:
        before = schedule.evaluate_tick(
            build_schedule_context(instance=instance, resources=iceberg)
        )
        assert "does not exist yet" in (before.skip_message or ""), before
    for batch in range(1, 6):  # history: 6 commits of small files
        harness.run(spec, use_spark=False)
        ledger_producer.produce(topic, records(10, first=10 + batch * 10))
    harness.run(spec, use_spark=False)
    first_ids = {s.snapshot_id for s in harness.table(spec).metadata.snapshots}
    maintain = build_ops_jobs([spec])[2]
    assert maintain.name == MAINTAIN_JOB
    pools = {node.definition.pool for node in maintain.graph.node_dict.values()}  # type: ignore[attr-defined]
    assert pools == {None}, "maintenance in the stream's pool would wait for it forever"
    with instance_for_test() as instance:
        assert schedule.job_name == MAINTAIN_JOB
        cron = schedule.cron_schedule
        assert isinstance(cron, str)
        assert len(cron.split(" ")[0].split(",")) == 4, cron  # every 15 minutes for a stream
        # The stream's Dagster run, started and beating, holds the pool (a second Dagster
        # execution in this process would share its loggers): the loop it runs is the engine's
        # stream_pipeline, run here in a thread on its own catalog.
        instance.add_run(
            DagsterRun(
                job_name=stream_job_name(spec),
                status=DagsterRunStatus.STARTED,
                tags={"pipeline": spec.name, HEARTBEAT_TAG: str(int(time.time()))},
            )
        )
        stop_stream, reports = threading.Event(), list[RunReport]()
        stream = threading.Thread(
            target=lambda: stream_pipeline(
                spec,
                harness.kafka.client_config(),
                resources["iceberg"].load_catalog(),
                harness.cluster_id,
                commit_interval_seconds(spec),
                should_stop=lambda: "test done" if stop_stream.is_set() else None,
                on_report=reports.append,
            ),
            daemon=True,
        )
        stream.start()
        produced, stop_producer = [70], threading.Event()

        def produce() -> None:
            while not stop_producer.is_set():
                ledger_producer.produce(topic, records(5, first=produced[0]))
                produced[0] += 5
                time.sleep(0.5)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        try:
            wait_for(lambda: sum(r.committed for r in reports) >= 3, "the stream's commits")
            time.sleep(8)  # the first history is now older than the retention
            context = build_schedule_context(instance=instance, resources=iceberg)
            request = schedule.evaluate_tick(context)
            assert request.run_requests, request.skip_message  # not skipped: a stream is alive
            (run_request,) = request.run_requests
            assert isinstance(run_request, RunRequest)
            result = maintain.execute_in_process(
                run_config=run_request.run_config,
                tags=run_request.tags,
                resources=resources,
                instance=instance,
            )
            assert result.success
            committed = sum(r.committed for r in reports)
            time.sleep(2)  # records keep arriving after maintenance
            stop_producer.set()
            producer.join(10)
            wait_for(
                lambda: harness.table(spec).scan().to_arrow().num_rows == produced[0],
                "the stream to ingest every record after maintenance",
            )
            assert sum(r.committed for r in reports) > committed, "the stream went on"
            assert stream.is_alive(), "the stream kept running beside maintenance"
        finally:
            stop_producer.set()
            stop_stream.set()
            stream.join(60)
    table = harness.table(spec)
    remaining = {s.snapshot_id for s in table.metadata.snapshots}
    assert first_ids.isdisjoint(remaining), "the history older than the retention expired"
    state = find_committed_state(table, spec.consumer_group_id)
    assert state is not None, "the watermark is still reachable"
    harness.assert_exactly_once(spec, ledger)
    assert harness.run(spec, use_spark=False).records == 0  # nothing re-read after expiry


def test_stream_whose_run_was_marked_failed_stops_itself(
    harness: Harness,
    resources: dict[str, Any],
    new_pipeline: NewPipeline,
    ledger: Ledger,
) -> None:
    """A zombie: the stream sensor marked the run failed (its heartbeat was late: slow, not
    dead) and may start another. The stream sees its run is no longer STARTED and stops
    between commits, so two streams of a pipeline never run side by side."""
    _, spec = new_pipeline("stream_zombie", partitions=2, produce=30, freshness_target_seconds=4)
    with instance_for_test(overrides=NO_COMPUTE_LOGS) as instance:
        with stream_run(spec, resources, instance) as (run, thread, messages):
            wait_for(lambda: commit_count(harness, spec) >= 1, "the stream's first commit")
            instance.report_run_failed(run, message="test: heartbeat older than the limit")
            thread.join(30)
            assert not thread.is_alive(), "a stream whose run failed kept streaming"
        assert any("no longer STARTED" in m for m in messages), messages
        assert STOP_TAG not in (instance.get_run_by_id(run.run_id) or run).tags
    harness.assert_exactly_once(spec, ledger)


def test_stream_of_a_pipeline_that_no_longer_streams_is_stopped(
    harness: Harness,
    resources: dict[str, Any],
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
) -> None:
    """The freshness target is raised above the floor (the pipeline now runs per commit): its
    stream sensor is gone, and ``stop_retired_streams`` of the new definitions stops the live
    stream run, which then frees the pool for the ingestion job."""
    topic, spec = new_pipeline("stream_retired", produce=20, freshness_target_seconds=4)
    slowed = spec.model_copy(update={"freshness_target_seconds": 600})
    # Both definitions are resolved before any Dagster instance is entered, as a code location
    # loads them: resolving reads the current instance's defs-state storage, and in two full runs
    # (never alone) that storage pointed at a disposed instance while a stream ran in a thread.
    streaming = build_definitions([spec]).resolve_sensor_def("stop_retired_streams")
    sensor = build_definitions([slowed]).resolve_sensor_def("stop_retired_streams")
    with instance_for_test(overrides=NO_COMPUTE_LOGS) as instance:
        with stream_run(spec, resources, instance) as (run, thread, messages):
            wait_for(lambda: commit_count(harness, spec) >= 1, "the stream's first commit")
            kept = streaming.evaluate_tick(build_sensor_context(instance=instance))
            assert "no stream run of a retired pipeline" in (kept.skip_message or "")
            tick = sensor.evaluate_tick(build_sensor_context(instance=instance))
            assert not tick.run_requests
            assert run.run_id in (tick.skip_message or ""), tick.skip_message
            thread.join(30)
            assert not thread.is_alive(), "the retired stream kept streaming"
        assert any("no longer streams" in m for m in messages), messages
        runs = instance.get_runs(RunsFilter(job_name=stream_job_name(spec)))
        assert [r.status for r in runs] == [DagsterRunStatus.SUCCESS]
    ledger_producer.produce(topic, records(10, first=20))
    assert harness.run(slowed, use_spark=False).records == 10  # run per commit takes over
    harness.assert_exactly_once(slowed, ledger)


def test_a_stream_beats_inside_a_long_iteration() -> None:
    """Issue 29 item 5: the heartbeat was written only between iterations, so one iteration
    catching up a backlog for longer than ``stale_after_seconds`` looked dead: the sensor marked
    the live run failed and started a second stream beside it. The stream op now beats from a
    thread (``beating``) for as long as its process lives, unless an iteration runs past the
    limit (hung: the sensor must still replace it); once the body ends it stops."""
    from ingestion.spec.pipeline import parse_pipeline_spec

    spec = parse_pipeline_spec(
        {"name": "beat", "topic": "t", "table": "n.t", "consumer_group_id": "g",
         "value_format": "raw", "freshness_target_seconds": 5}
    )  # fmt: skip
    old = str(int(time.time()) - 3600)
    with instance_for_test(overrides=NO_COMPUTE_LOGS) as instance:
        run = DagsterRun(
            job_name=stream_job_name(spec), status=DagsterRunStatus.STARTED,
            tags={HEARTBEAT_TAG: old},
        )  # fmt: skip
        instance.add_run(run)

        def current() -> DagsterRun:
            found = instance.get_run_by_id(run.run_id)
            assert found is not None
            return found

        assert is_stale(current(), spec, time.time(), None)  # an hour without a beat
        heartbeat = Heartbeat(every_s=0.2, limit_s=3.0)
        with beating(instance, run.run_id, heartbeat):
            time.sleep(1.5)  # one long iteration: should_stop (the old beat) is not called
            assert current().tags[HEARTBEAT_TAG] != old
            assert not is_stale(current(), spec, time.time(), None)
            time.sleep(2.0)  # past the iteration limit: hung, the beat stops
            hung = current().tags[HEARTBEAT_TAG]
            time.sleep(1.5)
            assert current().tags[HEARTBEAT_TAG] == hung, "a hung iteration kept beating"
            heartbeat.iteration()  # the next iteration starts: beating again
            time.sleep(1.5)
            assert current().tags[HEARTBEAT_TAG] != hung
        last = current().tags[HEARTBEAT_TAG]
        time.sleep(1.5)
        assert current().tags[HEARTBEAT_TAG] == last, "it beat after the stream ended"


def test_an_operator_action_stops_the_stream_acts_and_the_stream_comes_back(
    harness: Harness,
    resources: dict[str, Any],
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
) -> None:
    """Issue 29 item 2: an operator job's hold counted ingestion runs, not the stream, so a reset,
    migration or failover planned beside a live stream raced its commits (a failover re-read
    offsets the stream kept moving, then refused). Now the hold asks the stream to stop and waits
    for it, the stream sensor starts none while the operator run is in progress, and starts one
    again after it; the records produced meanwhile land once."""
    from platform_assets.operations.actions import hold_ingestion

    topic, spec = new_pipeline("stream_hold", partitions=2, produce=20, freshness_target_seconds=4)
    # Resolved before any instance is entered (see test_stream_of_a_pipeline_that_no_longer_...)
    sensor = build_definitions([spec]).resolve_sensor_def(f"{spec.name}_stream_sensor")
    with instance_for_test(overrides=NO_COMPUTE_LOGS) as instance:
        operator = DagsterRun(job_name="reset_offsets", status=DagsterRunStatus.STARTED)
        instance.add_run(operator)
        with stream_run(spec, resources, instance) as (run, thread, messages):
            wait_for(lambda: commit_count(harness, spec) >= 1, "the stream's first commit")
            assert hold_ingestion(instance, operator.run_id, spec, wait_s=60, poll_s=0.2) == 0
            thread.join(30)  # the run ends once its op returned
            assert not thread.is_alive(), "the stream kept running beside the operator action"
            stopped = instance.get_run_by_id(run.run_id)
            assert stopped is not None
            assert stopped.tags[STOP_TAG] == f"operator action (run {operator.run_id})"
            ledger_producer.produce(topic, records(10, first=20))
            context = build_sensor_context(
                instance=instance, resources={"kafka": resources["kafka"],
                                              "iceberg": resources["iceberg"]},
            )  # fmt: skip
            held = sensor.evaluate_tick(context)
            assert not held.run_requests
            assert f"operator action in progress (run {operator.run_id})" in (
                held.skip_message or ""
            )
        assert any("operator action" in m for m in messages), messages
        instance.report_run_failed(operator, message="test: the action ended")  # any end counts
        resumed = sensor.evaluate_tick(build_sensor_context(
            instance=instance, resources={"kafka": resources["kafka"],
                                          "iceberg": resources["iceberg"]},
        ))  # fmt: skip
        assert len(resumed.run_requests or []) == 1, resumed.skip_message
    assert harness.run(spec, use_spark=False).records == 10  # what the stream did not ingest
    harness.assert_exactly_once(spec, ledger)
