"""A blocked pipeline on the real stack (broker, catalog, Dagster instance; no Spark: small runs
prepare in the driver): the lag sensor requests one check-only run per cause and no ingestion,
the fallback schedule skips, the other checks say they were not evaluated, a blocked run is not
a RUN FAILED alert while any other failed run is, and a missing topic is one flagged
observation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from dagster import (
    AssetCheckKey,
    AssetSelection,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    Definitions,
    build_run_status_sensor_context,
    build_sensor_context,
    instance_for_test,
)

from ingestion.spec.pipeline import PipelineSpec
from platform_assets.alerts.sensors import run_failure_alert_sensor
from platform_assets.definitions import build_definitions
from platform_assets.ingest.assets import build_pipeline_assets
from platform_assets.ingest.checks import build_pipeline_checks
from platform_assets.ingest.jobs import build_ingest_all_job, build_observe_topics_job
from platform_assets.ingest.sensors import build_lag_sensor
from platform_assets.operations.jobs import MAINTAIN_JOB, MAINTAIN_OP
from platform_assets.pipelines import commit_state_key, table_key
from platform_assets.state import StateReader
from resources.alerts import AlertResource
from resources.kafka import KafkaResource
from tests.support.dagster_runs import add_serving_worker, evaluate_schedule, materialize_pipeline
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, NewPipeline, make_spec, records
from tests.support.webhook import WebhookReceiver

pytestmark = pytest.mark.integration
GROUP = "group_id_consistency"
SMALL = {"in_process_max_records": 10_000, "max_lag_records": 1, "max_lag_seconds": 3600}


@pytest.fixture
def alerts(webhook: WebhookReceiver) -> AlertResource:
    return AlertResource(webhook_url=webhook.url, ui_base_url="http://ui.example:3000")


def run(
    spec: PipelineSpec,
    resources: dict[str, Any],
    instance: DagsterInstance,
    selection: AssetSelection | None = None,
) -> Any:
    return materialize_pipeline(spec, resources, selection, instance, tags={"pipeline": spec.name})


def alert_for_run(result: Any, instance: DagsterInstance, alerts: AlertResource) -> None:
    context = build_run_status_sensor_context(
        sensor_name="run_failure_alerts",
        dagster_event=result.get_run_failure_event(),
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        resources={"alerts": alerts},
    ).for_run_failure()
    run_failure_alert_sensor(context)


def test_blocked_pipeline_one_check_run_no_ingestion_no_run_alert(
    resources: dict[str, Any],
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    alerts: AlertResource,
    webhook: WebhookReceiver,
) -> None:
    topic, good = new_pipeline("blocked", produce=20, consumer_group_id="cg-good", **SMALL)
    seed = make_spec(topic, "blocked", consumer_group_id="connect-sink-group", **SMALL)
    group_key = AssetCheckKey(table_key(seed), GROUP)
    defs = build_definitions([seed])
    sensor = defs.resolve_sensor_def("lag_sensor")
    fallback = defs.resolve_schedule_def("fallback_schedule")
    sensor_resources = {
        "kafka": resources["kafka"],
        "iceberg": resources["iceberg"],
        "alerts": alerts,
    }
    with instance_for_test() as instance:  # a schedule's context needs an instance ref
        assert run(good, resources, instance).success
        ledger_producer.produce(topic, records(20, first=20))

        def tick(cursor: str | None, sensor: Any = sensor) -> tuple[Any, str | None]:
            context = build_sensor_context(
                instance=instance, resources=sensor_resources, cursor=cursor
            )
            data = sensor.evaluate_tick(context)
            return data, data.cursor

        first, cursor = tick(None)  # blocked: only the check, once
        (request,) = first.run_requests
        assert request.asset_selection == []
        assert request.asset_check_keys == [group_key]
        second, cursor = tick(cursor)
        assert not second.run_requests
        assert f"ingestion of 'blocked' is blocked by {GROUP}" in (second.skip_message or "")
        assert "Fix: set consumer_group_id back to 'cg-good'" in (second.skip_message or "")

        # The requested run: the check fails, so Dagster fails the step; nothing is read.
        check_run = run(seed, resources, instance, AssetSelection.checks(group_key))
        assert not check_run.success
        (evaluation,) = check_run.get_asset_check_evaluations()
        assert not evaluation.passed
        assert "but none under 'connect-sink-group'" in (evaluation.description or "")
        third, cursor = tick(None)  # even with a lost cursor: the newest evaluation says it
        assert not third.run_requests

        skipped = evaluate_schedule(fallback, instance, sensor_resources)
        assert not skipped.run_requests
        assert "blocked by group_id_consistency" in (skipped.skip_message or "")

        # run_checks: every other check says why it was not evaluated; no group check.
        checks_job = build_definitions([seed]).resolve_job_def("run_checks")
        checked = checks_job.execute_in_process(
            instance=instance, resources=resources, raise_on_error=False
        )
        assert checked.success
        found = {e.check_name: e for e in checked.get_asset_check_evaluations()}
        assert GROUP not in found
        assert len(found) == 5
        for name, other in found.items():
            assert not other.passed, name
            assert other.severity.value == "WARN", name
            assert (other.description or "").startswith("not evaluated: ingestion of 'blocked'")
            assert other.metadata["blocked_by"].value == GROUP

        # A blocked run (launched by hand) and the check-only run: no RUN FAILED alert.
        blocked_run = run(seed, resources, instance)
        assert not blocked_run.success
        for failed in (check_run, blocked_run):
            alert_for_run(failed, instance, alerts)
        assert webhook.received == []
        before = resources["iceberg"].load_catalog().load_table(seed.table).current_snapshot()

        # Fixed: the same sensor launches ingestion again.
        fixed, _ = tick(cursor, build_definitions([good]).resolve_sensor_def("lag_sensor"))
        (request,) = fixed.run_requests
        assert request.asset_selection is None
        assert request.tags["lag"] == "20"
    after = resources["iceberg"].load_catalog().load_table(seed.table).current_snapshot()
    assert after.snapshot_id == before.snapshot_id  # nothing was ingested while blocked


def test_any_other_failed_run_alerts_with_its_cause_and_link(
    resources: dict[str, Any],
    new_pipeline: NewPipeline,
    alerts: AlertResource,
    webhook: WebhookReceiver,
) -> None:
    bad = [*records(3), (b"bad", b"{nope", None)]
    topic, spec = new_pipeline("badrecord", produce=bad, **SMALL)
    with DagsterInstance.ephemeral() as instance:
        result = run(spec, resources, instance)
        assert not result.success
        alert_for_run(result, instance, alerts)
    (alert,) = webhook.received
    run_id = result.dagster_run.run_id
    assert alert["kind"] == "run_failed"
    assert alert["title"] == f"pipeline 'badrecord', run {run_id} of __ephemeral_asset_job__"
    assert alert["message"].startswith("ingest_badrecord: ")
    assert f"{topic}" in alert["message"]
    assert alert["link"] == f"http://ui.example:3000/runs/{run_id}"


def test_observe_topics_flags_a_missing_topic_and_observes_the_others(
    kafka: KafkaResource, create_topic: Callable[..., str], ledger_producer: LedgerProducer
) -> None:
    present = create_topic(partitions=2)
    ledger_producer.produce(present, records(5))
    specs = [make_spec(present, "present"), make_spec("no-such-topic-i13", "absent")]
    with DagsterInstance.ephemeral() as instance:
        result = build_observe_topics_job(specs).execute_in_process(
            instance=instance, resources={"kafka": kafka}
        )
    assert result.success
    observations = {
        o.asset_key.path[-1]: o.metadata
        for o in result.asset_observations_for_node("observe_topic_offsets")
    }
    assert observations[present]["end_offsets_total"].value == 5
    assert "problem" not in observations[present]
    problem = str(observations["no-such-topic-i13"]["problem"].value)
    assert problem.startswith("not found: topic 'no-such-topic-i13'")
    assert "Pipeline 'absent' reads nothing from it" in problem


def test_one_lag_sensor_and_one_fallback_run_serve_every_pipeline_in_one_pass(
    resources: dict[str, Any],
    new_pipeline: NewPipeline,
    harness: Harness,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
    alerts: AlertResource,
    webhook: WebhookReceiver,
) -> None:
    """R52: one lag sensor reads the pipelines' states in one pass; a pipeline a stream
    worker serves is not read at all; one whose state cannot be read is skipped by name,
    alerted once per cause, while the others are decided; a pass stops at its budget and the
    next tick resumes with the first pipeline it did not reach. One fallback schedule asks an
    ``ingest_all`` run of each pipeline it may ingest (exactly once), none of one a run
    already ingests; one maintenance run maintains several pipelines, each on its own.

    The unreadable pipeline is a stand-in: ``StateReader.read`` raises for it (the real parts
    cannot be made to fail for one table and not the others mid-pass)."""
    _, over = new_pipeline("pass_over", produce=5, **SMALL)  # lag 5 >= 1: a run
    _, idle = new_pipeline("pass_idle", **SMALL)
    _, streamed = new_pipeline("pass_streamed", produce=3, freshness_target_seconds=4)
    _, broken = new_pipeline("pass_broken", produce=2, **SMALL)
    defs = build_definitions([over, idle, streamed, broken])
    sensor = defs.resolve_sensor_def("lag_sensor")
    sensor_resources = {
        "kafka": resources["kafka"],
        "iceberg": resources["iceberg"],
        "alerts": alerts,
    }
    reads: list[str] = []
    read = StateReader.read

    def read_or_fail(self: StateReader, spec: PipelineSpec, with_oldest: bool = False) -> Any:
        reads.append(spec.name)
        if spec.name == broken.name:
            raise RuntimeError("stand-in: this table's catalog entry cannot be read")
        return read(self, spec, with_oldest)

    monkeypatch.setattr(StateReader, "read", read_or_fail)
    with instance_for_test() as instance:
        add_serving_worker(instance, streamed)

        def tick(sensor: Any = sensor, cursor: str | None = None) -> Any:
            context = build_sensor_context(
                instance=instance, resources=sensor_resources, cursor=cursor
            )
            return sensor.evaluate_tick(context)

        data = tick()
        assert [r.job_name for r in data.run_requests] == ["ingest_pass_over_job"]
        assert reads == ["pass_broken", "pass_idle", "pass_over"]  # the streamed one: not read
        tick(cursor=data.cursor)  # still unreadable, same cause: no second alert
        (alert,) = webhook.received
        assert alert["kind"] == "state_unreadable"
        assert "'pass_broken'" in alert["title"]
        assert "stand-in: this table's catalog entry cannot be read" in alert["message"]

        # A pass that stops at its budget: one pipeline a tick, in turn.
        _, more = new_pipeline("pass_more", **SMALL)
        three = [idle, over, more]
        budget = build_lag_sensor(
            three, [ingest_job(build_definitions(three), s) for s in three], 0
        )
        reads.clear()
        first = tick(budget)
        assert reads == ["pass_idle"]
        assert "pass_over: not reached" in (first.skip_message or "")
        second = tick(budget, first.cursor)
        third = tick(budget, second.cursor)
        assert reads == ["pass_idle", "pass_more", "pass_over"]  # each in turn
        assert [r.job_name for r in third.run_requests] == ["ingest_pass_over_job"]

        # Every read failing (the broker or the catalog down): the tick fails loudly.
        only_broken = build_lag_sensor([broken], [ingest_job(defs, broken)])
        with pytest.raises(Exception, match="stand-in"):
            tick(only_broken)

        # One fallback run for the pipelines it may ingest, each exactly once.
        fallback = defs.resolve_schedule_def("fallback_schedule")
        due = evaluate_schedule(fallback, instance, sensor_resources)
        by_pipeline = {r.tags["pipeline"]: r for r in due.run_requests or []}
        assert sorted(by_pipeline) == ["pass_idle", "pass_over"]
        request = by_pipeline["pass_over"]
        assert set(request.asset_selection or []) == {table_key(over), commit_state_key(over)}
        specs = [over, idle, streamed, broken]
        on_test_stack = Definitions(  # the location's ingest_all, on the session's resources
            assets=[asset for spec in specs for asset in build_pipeline_assets(spec)],
            asset_checks=[build_pipeline_checks(spec) for spec in specs],
            jobs=[build_ingest_all_job(specs)],
            resources=resources,
        )
        result = on_test_stack.resolve_job_def("ingest_all").execute_in_process(
            instance=instance, asset_selection=request.asset_selection, tags=request.tags
        )
        assert result.success
        evaluated = {(e.asset_key, e.check_name) for e in result.get_asset_check_evaluations()}
        assert (table_key(over), GROUP) in evaluated
        assert {key for key, _ in evaluated} == {table_key(over)}
        harness.assert_exactly_once(over, ledger)
        # An ingest_all run of pass_over in progress: no fallback run of it, nor a lag run.
        selection = frozenset({table_key(over), commit_state_key(over)})
        instance.add_run(
            DagsterRun(
                job_name="ingest_all", status=DagsterRunStatus.STARTED, asset_selection=selection
            )
        )
        again = evaluate_schedule(fallback, instance, sensor_resources)
        assert [r.tags["pipeline"] for r in again.run_requests or []] == ["pass_idle"]
        reads.clear()
        tick()
        assert "pass_over" not in reads

        # One maintenance run, several pipelines: one without a table fails by name, the
        # other is maintained all the same.
        maintain = defs.resolve_job_def(MAINTAIN_JOB)
        config = {"pipelines": [broken.name, over.name], "compact": True}
        maintained = maintain.execute_in_process(
            run_config={"ops": {MAINTAIN_OP: {"config": config}}},
            instance=instance,
            resources=resources,
            raise_on_error=False,
        )
        assert not maintained.success
        failure = maintained.get_run_failure_event()
        assert "'pass_broken'" in str(failure.event_specific_data)
        logs = "\n".join(e.message or "" for e in instance.all_logs(maintained.run_id))
        assert "maintenance of 'pass_broken' failed" in logs
        assert "maintained 'pass_over':" in logs


def ingest_job(defs: Any, spec: PipelineSpec) -> Any:
    """The pipeline's ingest job, as the lag sensor targets it."""
    return defs.resolve_job_def(f"ingest_{spec.name}_job")
