"""``platform status`` (platform_assets/cli/status.py): by default the exactly-once audit's last
verdict recorded in a real Dagster instance, never a recount of Kafka; the audit named as not
evaluated without one; and every age measured after the audit, on the real broker and catalog."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetCheckKey, AssetSelection, DagsterInstance, materialize

from ingestion.health.checks import AUDIT_CHECK, Finding, evaluate_state_checks, failed, passed
from ingestion.health.state import PipelineState
from ingestion.health.status import Evaluated, build_status
from platform_assets.cli.main import main
from platform_assets.cli.status import (
    STALE_AFTER_S,
    audit_now,
    describe_check,
    pipeline_status,
    read_recorded_verdict,
)
from platform_assets.ingest.assets import build_pipeline_assets
from platform_assets.ingest.checks import build_pipeline_checks
from platform_assets.pipelines import load_pipelines, table_key
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource
from tests.platform_assets.cli.conftest import Demo, orders
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import make_spec

AUDIT = AUDIT_CHECK.name


def make_instance_home(tmp_path: Path) -> Path:
    """A Dagster instance where ``make dev`` keeps it: ``state_dir/dagster_home``."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return home


def record_audit_evaluation(
    home: Path, kafka: KafkaResource, tmp_path: Path, spark: SparkResource
) -> tuple[str, float]:
    """One evaluation of the demo pipeline's checks, as ``run_checks`` runs them, recorded in
    the instance at ``home``; its run id and the audit's timestamp as the instance stores it."""
    (spec,) = load_pipelines()
    resources = {
        "kafka": kafka,
        "iceberg": IcebergCatalogResource(state_dir=str(tmp_path)),
        "spark": spark,
    }
    with DagsterInstance.from_config(str(home)) as instance:
        result = materialize(
            [*build_pipeline_assets(spec), build_pipeline_checks(spec)],
            resources=resources,
            selection=AssetSelection.checks_for_assets(table_key(spec)),
            instance=instance,
        )
        (audit,) = [e for e in result.get_asset_check_evaluations() if e.check_name == AUDIT]
        assert audit.passed, audit.description
        record = instance.get_latest_asset_check_evaluation_record(
            AssetCheckKey(table_key(spec), AUDIT)
        )
        assert record is not None
        assert record.event is not None
        return result.run_id, record.event.timestamp


def status_json(*args: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The one pipeline's ``platform status --json`` document."""
    capsys.readouterr()
    assert main(["status", "--json", *args]) == 0
    (status,) = json.loads(capsys.readouterr().out)
    return dict(status)


@pytest.mark.integration
def test_status_reports_the_recorded_verdict_and_recounts_nothing(
    demo: Demo,
    kafka: KafkaResource,
    tmp_path: Path,
    spark_resource: SparkResource,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The audit's last evaluation in the instance, with its time and run, is what ``status``
    reports; a foreign append after it, which any recount finds, changes nothing until
    ``--audit`` recounts."""
    home = make_instance_home(tmp_path)
    run_id, recorded_s = record_audit_evaluation(home, kafka, tmp_path, spark_resource)
    table = demo.catalog.load_table("demo.orders")
    table.append(table.scan(limit=1).to_arrow())  # another writer: a recount would fail it

    status = status_json(capsys=capsys)
    audit = status["checks"][AUDIT]
    assert (audit["passed"], audit["skipped"], audit["fresh"], audit["stale"]) == (
        True, False, False, False,
    )  # fmt: skip
    assert audit["run_id"] == run_id
    assert audit["evaluated_at_ms"] == int(recorded_s * 1000)
    assert audit["age_s"] == round((status["as_of_ms"] - audit["evaluated_at_ms"]) / 1000, 1)
    assert audit["stale_after_s"] == STALE_AFTER_S == 600

    assert main(["status"]) == 0
    text = capsys.readouterr().out
    assert f"  {AUDIT}: passed " in text
    assert f" ago (last evaluation at {audit['evaluated_at']}, run {run_id})" in text
    assert f"FAILING {AUDIT}" not in text  # (other checks may fail: the topic is shared)

    audited = status_json("--audit", capsys=capsys)["checks"][AUDIT]
    assert audited["fresh"], audited
    assert not audited["passed"], audited
    assert "a writer outside the pipeline" in audited["message"], audited


@pytest.mark.integration
def test_without_an_instance_or_an_evaluation_the_audit_is_not_evaluated(
    demo: Demo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Named as not evaluated (skipped), never a pass: no instance, then one without any
    evaluation of the check."""
    status = status_json(capsys=capsys)
    audit = status["checks"][AUDIT]
    assert (audit["passed"], audit["skipped"], audit["evaluated_at"]) == (False, True, None)
    assert AUDIT not in status["failing_checks"]  # skipped: neither a pass nor a failure
    assert audit["message"].startswith(
        "not evaluated yet: no Dagster instance (DAGSTER_HOME unset); "
        "`platform status --audit` audits now"
    )
    assert main(["status"]) == 0
    text = capsys.readouterr().out
    assert f"skipped {AUDIT}: not evaluated yet: no Dagster instance (DAGSTER_HOME unset)" in text
    assert f"{AUDIT}: passed" not in text
    summary = [line for line in text.splitlines() if "checks: all" in line]  # when none fails
    assert all(AUDIT not in line for line in summary), summary

    home = make_instance_home(tmp_path)
    audit = status_json(capsys=capsys)["checks"][AUDIT]
    assert (audit["passed"], audit["skipped"]) == (False, True)
    assert audit["message"].startswith(
        f"not evaluated yet: no evaluation yet in the Dagster instance {home} "
        "(run_checks_every_5_minutes evaluates it)"
    )


@pytest.mark.integration
def test_every_age_is_measured_after_the_audit(
    demo: Demo,
    kafka: KafkaResource,
    tmp_path: Path,
    ledger_producer: LedgerProducer,
    demo_topic: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A stream commits while the audit recounts: the status assembled after the audit shows
    that commit, and the ages are measured from a clock read after both (before, the state was
    read before the audit: its last commit looked as old as the audit was long)."""
    (spec,) = load_pipelines()
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path))
    verdict = audit_now(spec, kafka, iceberg)  # the slow part: a real recount
    ledger_producer.produce(demo_topic, orders(500, 3))
    demo.ingest()  # committed while the audit ran, as far as the status can tell
    newest = demo.catalog.load_table("demo.orders").current_snapshot()
    assert newest is not None
    status = pipeline_status(spec, kafka, iceberg, verdict=verdict)
    assert status.commits[0]["snapshot_id"] == newest.snapshot_id
    audit = status.checks[AUDIT]
    assert audit["passed"], audit
    assert audit["fresh"], audit
    audited_ms = verdict.evaluated.at_ms
    assert audited_ms is not None
    assert audit["evaluated_at_ms"] == audited_ms < newest.timestamp_ms
    assert newest.timestamp_ms <= status.as_of_ms
    assert status.last_commit_age_s == round((status.as_of_ms - newest.timestamp_ms) / 1000, 1)

    document = status_json("--audit", capsys=capsys)  # the same order through the command
    audit = document["checks"][AUDIT]
    assert audit["fresh"], audit
    assert audit["passed"], audit
    assert audit["evaluated_at_ms"] <= document["as_of_ms"]
    head = demo.catalog.load_table("demo.orders").current_snapshot()
    assert head is not None
    assert head.snapshot_id == newest.snapshot_id
    assert document["last_commit_age_s"] == round(
        (document["as_of_ms"] - head.timestamp_ms) / 1000, 1
    )


def test_a_recorded_verdict_says_its_age_and_when_it_is_stale() -> None:
    """Pure: a verdict recorded 4 minutes before the status passes with its age; one 25 minutes
    old is STALE (older than twice the checks schedule's interval); a failure says both."""
    spec = make_spec("orders", "status_lines")
    now_ms = 1_795_845_600_000
    state = PipelineState(spec, table_exists=True, read_at_ms=now_ms)

    def line(age_s: float, finding: Finding) -> str | None:
        recorded = Evaluated(
            int(now_ms - age_s * 1000), fresh=False, run_id="5f1c", stale_after_s=STALE_AFTER_S
        )
        findings = {**evaluate_state_checks(state), AUDIT: finding}
        status = build_status(state, findings, now_ms, {AUDIT: recorded})
        return describe_check(AUDIT, status.checks[AUDIT])

    assert line(240, passed("ok")) == (
        f"  {AUDIT}: passed 4 min ago (last evaluation at 2026-11-28T05:56:00Z, run 5f1c)"
    )
    stale = line(25 * 60, passed("ok"))
    assert stale is not None
    assert "passed 25 min ago (last evaluation at 2026-11-28T05:35:00Z, run 5f1c), STALE" in stale
    assert "older than 10 min, twice the interval of run_checks_every_5_minutes" in stale
    assert line(240, failed("ERROR", "snapshot 7 added 5")) == (
        f"  FAILING {AUDIT}: failed (ERROR) 4 min ago (last evaluation at "
        "2026-11-28T05:56:00Z, run 5f1c): snapshot 7 added 5"
    )
    never = read_recorded_verdict(None, spec, "no Dagster instance (DAGSTER_HOME unset)")
    assert never.evaluated.at_ms is None
    assert never.finding.skipped
