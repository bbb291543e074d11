"""An operator job acting while the lag sensor keeps launching ingestion runs: the job marks
its run, the lag sensor launches none of that pipeline meanwhile (for
at most ``OPERATOR_HOLD_LIMIT``), and the job waits for the run in progress to end instead of
refusing (``platform_assets.operations.actions.hold_ingestion``). Unit level, on a Dagster
test instance and a real embedded catalog: the runs that count as ingesting a pipeline, the hold
and its refusal, and reset and migration refused on a moved route."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    build_sensor_context,
    instance_for_test,
)

from ingestion.exceptions import OperationRefusedError
from ingestion.pipeline.run import run_pipeline
from ingestion.table.offsets import FAILOVER_TO, TopicOffsets, commit_properties
from ingestion.table.route import FAILOVER_ORIGIN, FAILOVER_TOPICS
from ingestion.table.schema import load_or_create_table
from platform_assets.definitions import build_definitions
from platform_assets.ingest import jobs
from platform_assets.ingest.jobs import OPERATOR_TAG, active_operator_runs
from platform_assets.operations import actions
from platform_assets.operations.actions import (
    count_ingestion_runs,
    hold_ingestion,
    refuse_off_route,
)
from platform_assets.operations.jobs import build_ops_jobs
from platform_assets.pipelines import table_key
from platform_assets.streaming.jobs import SERVING_TAG, STREAM_JOB, active_stream_runs
from resources.alerts import AlertResource
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.conftest import NewPipeline
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import make_spec, records


def reset_to_latest(
    job: Any, instance: DagsterInstance, resources: dict[str, Any], wait_s: float
) -> Any:
    config = {
        "pipeline": "held",
        "to": "latest",
        "apply": True,
        "reason": "test",
        "wait_for_runs_seconds": wait_s,
    }
    return job.execute_in_process(
        run_config={"ops": {"reset_pipeline_offsets": {"config": config}}},
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )


@pytest.mark.integration
def test_the_lag_sensor_launches_no_run_while_an_operator_job_acts_on_the_pipeline(
    kafka: KafkaResource,
    tmp_path: Path,
    new_pipeline: NewPipeline,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, spec = new_pipeline("held_sensor", produce=5, max_lag_records=1)
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path))
    defs = build_definitions([spec])
    sensor = defs.resolve_sensor_def("lag_sensor")
    resources = {"kafka": kafka, "iceberg": iceberg, "alerts": AlertResource()}
    with instance_for_test() as instance:
        acting = instance.add_run(
            DagsterRun(
                job_name="failover",
                status=DagsterRunStatus.STARTED,
                tags={OPERATOR_TAG: "held_sensor"},
            )
        )
        other = DagsterRun(
            job_name="failover",
            status=DagsterRunStatus.STARTED,
            tags={OPERATOR_TAG: "another_pipeline"},
        )
        instance.add_run(other)
        held = sensor.evaluate_tick(build_sensor_context(instance=instance, resources=resources))
        assert not held.run_requests
        assert f"operator action in progress (run {acting.run_id})" in (held.skip_message or "")

        # A run whose process died stays STARTED without run monitoring: past the limit it
        # no longer holds the pipeline.
        monkeypatch.setattr(jobs, "OPERATOR_HOLD_LIMIT", dt.timedelta(seconds=1))
        time.sleep(1.5)
        free = sensor.evaluate_tick(build_sensor_context(instance=instance, resources=resources))
        assert free.run_requests, free.skip_message  # lag 5 >= 1: a run, as before the action
        monkeypatch.undo()
        instance.delete_run(acting.run_id)  # the operator's run ended
        free = sensor.evaluate_tick(build_sensor_context(instance=instance, resources=resources))
        assert free.run_requests, free.skip_message


@pytest.mark.integration
def test_an_operator_job_waits_for_the_run_in_progress_instead_of_refusing(
    kafka: KafkaResource,
    tmp_path: Path,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
) -> None:
    topic, spec = new_pipeline("held", produce=10)
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path))
    run_pipeline(spec, kafka.client_config(), iceberg.load_catalog(), None, kafka.get_cluster_id())
    ledger_producer.produce(topic, records(5, first=10))
    reset_job = build_ops_jobs([spec])[0]
    resources = {"kafka": kafka, "iceberg": iceberg}
    with instance_for_test() as instance:
        ingesting = instance.add_run(
            DagsterRun(job_name="ingest_held_job", status=DagsterRunStatus.STARTED)
        )

        def end_the_run_once_held() -> None:
            while not active_operator_runs(instance, spec):
                time.sleep(0.1)
            time.sleep(1.5)  # the job is waiting, not refused
            instance.delete_run(ingesting.run_id)

        ender = threading.Thread(target=end_the_run_once_held, daemon=True)
        ender.start()
        result = reset_to_latest(reset_job, instance, resources, wait_s=60)
        ender.join(10)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        assert (instance.get_run_by_id(result.run_id) or result).tags[OPERATOR_TAG] == "held"
        assert not active_operator_runs(instance, spec)  # ended: the sensor launches again
        table = iceberg.load_catalog().load_table(spec.table)
        assert table.scan().to_arrow().num_rows == 10  # reset to latest: the 5 new are skipped
        assert (
            run_pipeline(
                spec, kafka.client_config(), iceberg.load_catalog(), None, kafka.get_cluster_id()
            ).records
            == 0
        )

        # A run that does not end within the wait still refuses the action, by name.
        alive = instance.add_run(
            DagsterRun(job_name="ingest_held_job", status=DagsterRunStatus.STARTED)
        )
        started = time.monotonic()
        refused = reset_to_latest(reset_job, instance, resources, wait_s=2)
        assert not refused.success
        assert time.monotonic() - started >= 2
        (failure,) = refused.get_step_failure_events()
        message = str(failure.step_failure_data.error)
        assert "after waiting 2 s" in message, message
        assert f"1 ingestion run(s) in progress (run {alive.run_id}" in message, message
        assert "platform clear-dead-runs held" in message
        assert "wait_for_runs_seconds" in message


SPEC = make_spec("orders", "acting", replicas=[{"name": "dr", "source_alias": "primary"}])


def test_its_own_job_and_ingest_all_count_as_ingesting_a_pipeline() -> None:
    """An ``ingest_all`` run counts unless it selected other pipelines only (a fallback run)."""
    other = make_spec("other", "other")
    with DagsterInstance.ephemeral() as instance:
        for job, status, assets in [
            ("ingest_acting_job", DagsterRunStatus.STARTED, None),
            ("ingest_all", DagsterRunStatus.STARTING, None),  # every pipeline
            ("ingest_all", DagsterRunStatus.STARTED, {table_key(SPEC), table_key(other)}),
            ("ingest_all", DagsterRunStatus.STARTED, {table_key(other)}),  # not this one
            ("ingest_acting_job", DagsterRunStatus.SUCCESS, None),  # ended
            ("ingest_other_job", DagsterRunStatus.STARTED, None),  # another pipeline
        ]:
            selection = frozenset(assets) if assets is not None else None
            instance.add_run(DagsterRun(job_name=job, status=status, asset_selection=selection))
        assert count_ingestion_runs(instance, SPEC) == 3


def test_the_hold_marks_the_operator_run_and_refuses_while_a_run_stays_active() -> None:
    with DagsterInstance.ephemeral() as instance:
        operator = instance.add_run(DagsterRun(job_name="reset_offsets"))
        assert hold_ingestion(instance, operator.run_id, SPEC, wait_s=0) == 0
        assert (instance.get_run_by_id(operator.run_id) or operator).tags[OPERATOR_TAG] == (
            "acting"
        )
        instance.add_run(DagsterRun(job_name="ingest_acting_job", status=DagsterRunStatus.STARTED))
        started = time.monotonic()
        refusal = re.escape(
            "after waiting 0.3 s (config wait_for_runs_seconds): pipeline 'acting': "
            "1 ingestion run(s) in progress (run "
        )
        with pytest.raises(OperationRefusedError, match=refusal):
            hold_ingestion(instance, operator.run_id, SPEC, wait_s=0.3, poll_s=0.05)
        assert time.monotonic() - started >= 0.3


def switched(iceberg: IcebergCatalogResource, cluster_id: str, **properties: str) -> None:
    table = load_or_create_table(iceberg.load_catalog(), SPEC)
    offsets = commit_properties(
        group_id=SPEC.consumer_group_id,
        offsets={"orders": TopicOffsets("id", {0: 1})},
        commit_id=cluster_id,
        cluster_id=cluster_id,
        pipeline=SPEC.name,
    )
    with (
        table.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties={**offsets, **properties}).fast_append(),
    ):
        pass


def test_reset_and_migration_are_refused_on_a_moved_route(tmp_path: Path) -> None:
    kafka = KafkaResource(
        bootstrap_servers="nowhere:1", replicas={"dr": {"bootstrap.servers": "nowhere:2"}}
    )
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path))
    switched(iceberg, "k-primary")
    refuse_off_route(SPEC, kafka, iceberg, "reset")  # on its own route: allowed
    names = orjson.dumps({"orders": "primary.orders"}).decode()
    switched(iceberg, "k-dr", **{FAILOVER_TO: "dr", FAILOVER_TOPICS: names})
    refusal = re.escape("reads ['primary.orders'] on 'dr' since a failover; reset is not")
    with pytest.raises(OperationRefusedError, match=refusal):
        refuse_off_route(SPEC, kafka, iceberg, "reset")
    back = orjson.dumps({"orders": "dr.orders"}).decode()
    origin = orjson.dumps([{"topic": "orders", "partition": 0}]).decode()
    failback = {FAILOVER_TO: "primary", FAILOVER_TOPICS: back, FAILOVER_ORIGIN: origin}
    switched(iceberg, "k-back", **failback)
    with pytest.raises(OperationRefusedError, match="platform complete-failback acting"):
        refuse_off_route(SPEC, kafka, iceberg, "migrate-group")


def test_an_action_waits_for_canceling_runs_as_for_started_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run being terminated (CANCELING: ``make dev`` stopping, Terminate in the UI) may still
    commit until its process ends, a stream worker's lanes until they stopped: the action
    refuses while one stays, waits for it to end, and its own CANCELING run still holds."""
    with instance_for_test() as instance:

        def canceling(job_name: str, **tags: str) -> DagsterRun:
            run = instance.add_run(
                DagsterRun(job_name=job_name, status=DagsterRunStatus.STARTED, tags=tags)
            )
            instance.report_run_canceling(run, message="test: terminate")
            return instance.get_run_by_id(run.run_id) or run

        ingesting = canceling("ingest_acting_job")
        first = instance.add_run(DagsterRun(job_name="reset_offsets"))
        refusal = re.escape(
            "pipeline 'acting': 1 ingestion run(s) in progress "
            f"(run {ingesting.run_id} (job ingest_acting_job, CANCELING since "
        )
        with pytest.raises(OperationRefusedError, match=refusal):
            hold_ingestion(instance, first.run_id, SPEC, wait_s=0.1, poll_s=0.05)

        # The operator's own run, terminated, holds the pipeline until it ended.
        instance.report_run_canceling(first, message="test: terminate")
        assert jobs.operator_holds(instance, [SPEC.name]) == {SPEC.name: first.run_id}
        instance.report_run_canceled(instance.get_run_by_id(first.run_id) or first)
        assert not jobs.operator_holds(instance, [SPEC.name])

        serving = orjson.dumps({SPEC.name: "v1"}).decode()
        worker = canceling(STREAM_JOB, **{SERVING_TAG: serving})
        assert [run.run_id for run in active_stream_runs(instance, SPEC)] == [worker.run_id]
        polled = threading.Event()

        class Clock:  # the hold's clock, telling when it waits
            monotonic = staticmethod(time.monotonic)

            @staticmethod
            def sleep(seconds: float) -> None:
                polled.set()
                time.sleep(seconds)

        def end_both_once_waiting() -> None:
            assert polled.wait(30)
            for run in (ingesting, worker):
                instance.report_run_canceled(run, message="test: its process ended")

        monkeypatch.setattr(actions, "time", Clock)
        ender = threading.Thread(target=end_both_once_waiting, daemon=True)
        ender.start()
        second = instance.add_run(DagsterRun(job_name="reset_offsets"))
        assert hold_ingestion(instance, second.run_id, SPEC, wait_s=30, poll_s=0.05) == 0
        ender.join(10)
        assert polled.is_set()  # it waited for them, then went ahead
