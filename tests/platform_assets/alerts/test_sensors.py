"""The alert sensors on a real (ephemeral) Dagster instance, no Kafka or Spark: a failing check
is alerted once, then its recovery, naming its pipeline; a failed run is alerted with its
innermost cause and link, once per cause; a run that failed only because a blocking check
failed is left to that check's alert. Alerts go to a webhook receiver on a loopback port."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from dagster import (
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    ExecuteInProcessResult,
    asset,
    asset_check,
    build_run_status_sensor_context,
    build_sensor_context,
    job,
    materialize,
    op,
)

from platform_assets.alerts.policy import Notice
from platform_assets.alerts.sensors import (
    build_check_alert_sensor,
    check_alert,
    run_failure_alert_sensor,
)
from resources.alerts import AlertResource
from tests.support.webhook import WebhookReceiver

OUTCOME = {"passed": False}


@asset(key=["iceberg", "n", "t"])
def table() -> None:
    """The checked asset."""


@asset_check(asset=table, name="freshness")
def freshness() -> AssetCheckResult:
    """Passes or fails as the test says."""
    passed = OUTCOME["passed"]
    return AssetCheckResult(
        passed=passed,
        severity=AssetCheckSeverity.ERROR,
        description="fresh" if passed else "the newest commit is 2 h old",
    )


KEY = AssetCheckKey(AssetKey(["iceberg", "n", "t"]), "freshness")


def evaluate(instance: DagsterInstance, passed: bool) -> None:
    OUTCOME["passed"] = passed
    assert materialize([table, freshness], instance=instance).success


def test_a_failing_check_is_alerted_once_then_its_recovery(webhook: WebhookReceiver) -> None:
    sensor = build_check_alert_sensor([KEY], {KEY.asset_key: "orders"})
    alerts = {"alerts": AlertResource(webhook_url=webhook.url)}
    cursor = None
    with DagsterInstance.ephemeral() as instance:
        for passed in (False, False, True, True):
            evaluate(instance, passed)
            context = build_sensor_context(instance=instance, resources=alerts, cursor=cursor)
            sensor(context)
            cursor = context.cursor
    assert [a["kind"] for a in webhook.received] == ["check_failed", "check_recovered"]
    failed, recovered = webhook.received
    assert failed["title"] == "pipeline 'orders', check freshness (ERROR) on iceberg/n/t"
    assert failed["message"] == "the newest commit is 2 h old"
    assert failed["details"]["pipeline"] == "orders"
    assert recovered["message"].startswith("passes again after ")
    assert recovered["message"].endswith(" failing: fresh")


@pytest.mark.parametrize(
    ("kind", "title", "message"),
    [
        ("check_failed", "check freshness (WARN) on iceberg/n/t", "boom"),
        (
            "check_recovered",
            "check freshness on iceberg/n/t",
            "passes again after 2.0 h failing: boom",
        ),
        ("check_reminder", "check freshness on iceberg/n/t", "still failing after 2.0 h: boom"),
    ],
)
def test_each_notice_becomes_an_alert_with_a_link(kind: str, title: str, message: str) -> None:
    notice = Notice(kind, "iceberg/n/t", "freshness", "WARN", "boom", "r1", 1000.0)  # type: ignore[arg-type]
    alert = check_alert(notice, None, AlertResource(ui_base_url="http://ui:3000"), 1000.0 + 7200)
    assert (alert.kind, alert.title, alert.message, alert.severity) == (
        kind,
        title,
        message,
        "WARN",
    )
    assert alert.link.startswith("http://ui:3000/")


@op
def load() -> None:
    raise ValueError("the warehouse is read-only")


@job(tags={"pipeline": "orders"})
def ingest() -> None:
    load()


AlertRunFailure = Callable[[ExecuteInProcessResult, DagsterInstance], None]


@pytest.fixture
def alert_run_failure(webhook: WebhookReceiver) -> AlertRunFailure:
    """Evaluates run_failure_alerts for a failed run, as Dagster does."""

    def _alert(result: ExecuteInProcessResult, instance: DagsterInstance) -> None:
        context = build_run_status_sensor_context(
            sensor_name="run_failure_alerts",
            dagster_event=result.get_run_failure_event(),
            dagster_instance=instance,
            dagster_run=result.dagster_run,
            resources={"alerts": AlertResource(webhook_url=webhook.url)},
        ).for_run_failure()
        run_failure_alert_sensor(context)

    return _alert


def run_failing(instance: DagsterInstance) -> ExecuteInProcessResult:
    result = ingest.execute_in_process(instance=instance, raise_on_error=False)
    assert not result.success
    return result


def test_a_failed_run_is_alerted_with_its_cause_once_per_cause(
    webhook: WebhookReceiver, alert_run_failure: AlertRunFailure
) -> None:
    with DagsterInstance.ephemeral() as instance:
        first = run_failing(instance)
        alert_run_failure(first, instance)
        alert_run_failure(run_failing(instance), instance)  # failed like the one before: no alert
    (alert,) = webhook.received
    assert alert["kind"] == "run_failed"
    assert alert["title"] == f"pipeline 'orders', run {first.run_id} of ingest"
    assert alert["message"] == "load: ValueError: the warehouse is read-only"
    assert alert["details"] == {"run_id": first.run_id, "pipeline": "orders", "job": "ingest"}


def test_a_run_blocked_by_a_failing_blocking_check_is_left_to_the_check(
    webhook: WebhookReceiver, alert_run_failure: AlertRunFailure
) -> None:
    @asset_check(asset=table, name="group_id_consistency", blocking=True)
    def consistency() -> AssetCheckResult:
        return AssetCheckResult(passed=False, severity=AssetCheckSeverity.ERROR)

    @asset(key=["iceberg", "n", "after"], deps=[table])
    def downstream() -> None:
        """Blocked by the check."""

    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [table, consistency, downstream], instance=instance, raise_on_error=False
        )
        assert not result.success
        alert_run_failure(result, instance)
    assert webhook.received == []
