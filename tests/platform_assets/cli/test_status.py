"""``platform status`` (platform_assets/cli/status.py): by default the exactly-once audit's last
verdict recorded in a real Dagster instance, never a recount of Kafka; the audit named as not
evaluated without one, for a table that is not the one it audited, and when its newest
execution did not finish; a pass that did not cover everything said with its caveats; and every
age measured after the audit, on the real broker and catalog."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetCheckKey,
    AssetSelection,
    DagsterInstance,
    DagsterRunStatus,
    ExecuteInProcessResult,
    materialize,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from pyiceberg.table import Table

from ingestion.health.checks import (
    AUDIT_CHECK,
    STATE_CHECKS,
    Finding,
    evaluate_state_checks,
    failed,
    passed,
)
from ingestion.health.state import PipelineState
from ingestion.health.status import Evaluated, build_status, format_instant
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.cli.main import main
from platform_assets.cli.status import (
    STALE_AFTER_S,
    AuditedTable,
    audit_caveats,
    audit_now,
    describe_check,
    pipeline_status,
    print_status,
    read_recorded_verdict,
    tie_to_table,
)
from platform_assets.ingest.assets import build_pipeline_assets
from platform_assets.ingest.checks import build_pipeline_checks
from platform_assets.instance import create_storage
from platform_assets.pipelines import load_pipelines, table_key
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource
from tests.platform_assets.cli.conftest import Demo, orders
from tests.support.brokers import delete_records
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import Harness, NewPipeline, make_spec, records

AUDIT = AUDIT_CHECK.name
DEADLINE_S = 30.0


def make_instance_home(tmp_path: Path) -> Path:
    """A Dagster instance where ``make dev`` keeps it (``state_dir/dagster_home``), its storage
    created as ``make dev`` creates it (the CLI opens an instance, never creates one)."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    create_storage(home)
    return home


def evaluate_checks(
    home: Path,
    kafka: KafkaResource,
    state_dir: Path,
    spark: SparkResource,
    spec: PipelineSpec | None = None,
) -> ExecuteInProcessResult:
    """One run of a pipeline's checks (the demo's by default), as ``run_checks`` runs them,
    on the catalog under ``state_dir``, recorded in the instance at ``home``; a run that fails
    is returned, not raised."""
    spec = spec or load_pipelines()[0]
    resources = {
        "kafka": kafka,
        "iceberg": IcebergCatalogResource(state_dir=str(state_dir)),
        "spark": spark,
    }
    with DagsterInstance.from_config(str(home)) as instance:
        return materialize(
            [*build_pipeline_assets(spec), build_pipeline_checks(spec)],
            resources=resources,
            selection=AssetSelection.checks_for_assets(table_key(spec)),
            instance=instance,
            raise_on_error=False,
        )


def record_audit_evaluation(
    home: Path,
    kafka: KafkaResource,
    tmp_path: Path,
    spark: SparkResource,
    spec: PipelineSpec | None = None,
) -> tuple[str, float]:
    """One evaluation of the demo pipeline's checks (:func:`evaluate_checks`), its audit a
    pass; its run id and the audit's timestamp as the instance stores it."""
    spec = spec or load_pipelines()[0]
    result = evaluate_checks(home, kafka, tmp_path, spark, spec)
    assert result.success
    (audit,) = [e for e in result.get_asset_check_evaluations() if e.check_name == AUDIT]
    assert audit.passed, audit.description
    with DagsterInstance.from_config(str(home)) as instance:
        record = instance.get_latest_asset_check_evaluation_record(
            AssetCheckKey(table_key(spec), AUDIT)
        )
    assert record is not None
    assert record.event is not None
    return result.run_id, record.event.timestamp


def recorded_metadata(home: Path) -> dict[str, Any]:
    """The metadata of the demo audit's last evaluation in the instance at ``home``."""
    (spec,) = load_pipelines()
    with DagsterInstance.from_config(str(home)) as instance:
        record = instance.get_latest_asset_check_evaluation_record(
            AssetCheckKey(table_key(spec), AUDIT)
        )
    assert record is not None
    assert record.evaluation is not None
    return {name: value.value for name, value in record.evaluation.metadata.items()}


def head_id(table: Table) -> int:
    """The id of the table's current snapshot."""
    head = table.current_snapshot()
    assert head is not None
    return head.snapshot_id


def audit_lines(text: str) -> list[str]:
    """The lines of ``platform status`` that name the audit, the summary line included."""
    return [line for line in text.splitlines() if AUDIT in line]


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
    outcome = (audit["passed"], audit["skipped"], audit["fresh"], audit["stale"])
    assert outcome == (True, False, False, False)
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


@pytest.mark.integration
def test_a_recorded_pass_with_a_backlog_is_printed_with_its_caveats(
    demo: Demo,
    kafka: KafkaResource,
    tmp_path: Path,
    spark_resource: SparkResource,
    ledger_producer: LedgerProducer,
    demo_topic: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An evaluation whose budget left a commit for the next one passes (R47), and says so in
    its message and its ``backlog_commits``: ``status`` prints it "passed with caveats", the
    backlog named, never a bare "passed" folded into ``checks: all N pass``; ``--json`` carries
    the ``caveats``."""
    home = make_instance_home(tmp_path)
    record_audit_evaluation(home, kafka, tmp_path, spark_resource)  # the cursor: the head
    ledger_producer.produce(demo_topic, orders(100, 6))
    demo.ingest()
    ledger_producer.produce(demo_topic, orders(200, 2))
    demo.ingest()
    (spec,) = load_pipelines()
    # A budget of 5 offsets: the first commit (6 records) is recounted whatever the budget, the
    # second (2 records and its markers) is left for the next evaluation, within one budget.
    run_id, _ = record_audit_evaluation(
        home, kafka, tmp_path, spark_resource, spec.model_copy(update={"audit_recount_offsets": 5})
    )
    metadata = recorded_metadata(home)
    assert metadata["backlog_commits"] == 1, metadata

    audit = status_json(capsys=capsys)["checks"][AUDIT]
    assert (audit["passed"], audit["skipped"], audit["run_id"]) == (True, False, run_id)
    (caveat,) = audit["caveats"]
    assert caveat.startswith(
        f"1 commit(s) ({metadata['backlog_offsets']} offsets) not yet audited, the oldest "
    ), caveat
    assert caveat.endswith(" s old, left for the next evaluation"), caveat
    assert "not yet audited" in audit["message"]

    assert main(["status"]) == 0
    (line, *summary) = audit_lines(capsys.readouterr().out)
    assert line.startswith(f"  {AUDIT}: passed with caveats "), line
    assert f"run {run_id}): " in line
    assert line.endswith(f"{caveat} ({audit['message']})"), line
    assert all("1 with caveats (exactly_once_audit)" in s for s in summary), summary


@pytest.mark.integration
def test_a_full_audit_that_left_ranges_unchecked_passes_with_caveats(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    kafka: KafkaResource,
    catalog_resource: IcebergCatalogResource,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--full-audit`` on a table whose first commits were expired and whose first offsets
    Kafka's retention deleted: the audit passes on what it could recount and names the range
    it could not (``not_recounted``). ``status`` prints that pass with its caveat; before, a
    fresh pass printed nothing and the summary read "checks: all N pass"."""
    topic, spec = new_pipeline("status_caveats", produce=10)
    for batch in range(3):
        if batch:
            ledger_producer.produce(topic, records(10, first=batch * 10))
        harness.run(spec, use_spark=False)
    table = harness.table(spec)
    head = head_id(table)
    older = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != head]
    table.maintenance.expire_snapshots().by_ids(older).commit()  # another engine's expiry
    delete_records(kafka, topic, 0, 12)

    status = pipeline_status(spec, kafka, catalog_resource, full_audit=True)
    audit = status.checks[AUDIT]
    assert (audit["passed"], audit["fresh"]) == (True, True), audit["message"]
    named = (
        f"{topic}[0] offsets [0, 12) were deleted by Kafka's retention before this audit (its "
        "log starts at 12): not recounted"
    )
    # (with what the per-commit recount could not verify: the oldest commit left's start)
    assert f"not recounted: {named}" in audit["caveats"]
    assert status.to_dict()["checks"][AUDIT]["caveats"] == audit["caveats"]
    print_status(status)
    (line, *summary) = audit_lines(capsys.readouterr().out)
    noted = "; ".join(audit["caveats"])
    assert line == f"  {AUDIT}: passed with caveats: {noted} ({audit['message']})"
    assert all("1 with caveats (exactly_once_audit)" in s for s in summary), summary


def test_the_summary_counts_the_passes_with_caveats(capsys: pytest.CaptureFixture[str]) -> None:
    """Pure: every check passes, the audit with caveats (fresh: a pass without any prints
    nothing of its own): its line names them and the summary counts it."""
    spec = make_spec("orders", "status_summary")
    now_ms = 1_795_845_600_000
    state = PipelineState(spec, table_exists=True, read_at_ms=now_ms)
    findings = {check.name: passed("ok") for check in STATE_CHECKS}
    backlog = {"backlog_commits": 2, "backlog_offsets": 40, "not_verified": "snapshot 7: x"}
    caveats = audit_caveats(backlog)
    assert caveats == (
        "not verified: snapshot 7: x",
        "2 commit(s) (40 offsets) not yet audited, left for the next evaluation",
    )
    upsert = audit_caveats({"mode": "full", "range_partitions_recounted": 2}, upsert=True)
    assert upsert == (
        "mode: upsert: only the rows were checked against Kafka's records (a record whose key "
        "changed again or was deleted has no row)",
    )
    nothing = audit_caveats({"range_partitions_recounted": 0, "expired_snapshots": 3})
    assert nothing == (
        "the commits of the expired snapshots are not audited (no range could be recounted)",
    )
    assert audit_caveats({"range_partitions_recounted": 0, "expired_snapshots": 0}) == ()
    status = build_status(state, {**findings, AUDIT: passed("2 commit(s) recounted")}, now_ms)
    print_status(status)
    assert audit_lines(capsys.readouterr().out) == [
        f"  checks: all {len(STATE_CHECKS) + 1} pass ({', '.join([*findings, AUDIT])})"
    ]
    audit = passed("2 commit(s) recounted", backlog)
    status = build_status(state, {**findings, AUDIT: audit}, now_ms, caveats={AUDIT: caveats})
    print_status(status)
    assert audit_lines(capsys.readouterr().out) == [
        f"  {AUDIT}: passed with caveats: {'; '.join(caveats)} (2 commit(s) recounted)",
        f"  checks: all {len(STATE_CHECKS) + 1} pass ({', '.join([*findings, AUDIT])}), "
        f"1 with caveats ({AUDIT})",
    ]
    failing = build_status(state, {AUDIT: failed("ERROR", "x")}, now_ms, caveats={AUDIT: caveats})
    assert failing.checks[AUDIT]["caveats"] == []  # a failure's message says it all


@pytest.mark.integration
def test_a_verdict_of_another_table_is_not_evaluated_for_this_one(
    demo: Demo,
    kafka: KafkaResource,
    tmp_path: Path,
    spark_resource: SparkResource,
    ledger_producer: LedgerProducer,
    demo_topic: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The last evaluation passed on the table as it was; then, outside ``make dev``, the table
    is rolled back past the audited snapshot, dropped, and recreated. Each time ``status`` says
    the verdict is not of this table (skipped, never a pass), until the next evaluation."""
    home = make_instance_home(tmp_path)
    table = demo.catalog.load_table("demo.orders")
    first = head_id(table)
    ledger_producer.produce(demo_topic, orders(300, 3))
    demo.ingest()
    run_id, _ = record_audit_evaluation(home, kafka, tmp_path, spark_resource)
    table = demo.catalog.load_table("demo.orders")
    audited, uuid = head_id(table), str(table.metadata.table_uuid)
    metadata = recorded_metadata(home)  # what ties the evaluation to its table
    assert (metadata["audit_cursor"], metadata["table_uuid"]) == (str(audited), uuid)
    snapshot = table.metadata.snapshot_by_id(audited)
    assert snapshot is not None
    assert metadata["audit_cursor_ms"] == str(snapshot.timestamp_ms)

    def audit_status() -> dict[str, Any]:
        audit = status_json(capsys=capsys)["checks"][AUDIT]
        assert (audit["passed"], audit["skipped"], audit["run_id"]) == (False, True, run_id)
        assert main(["status"]) == 0
        lines = audit_lines(capsys.readouterr().out)
        assert lines[0].startswith(f"  skipped {AUDIT}: not evaluated "), lines
        assert all(f"{AUDIT}: passed" not in line for line in lines), lines
        return dict(audit)

    table.manage_snapshots().rollback_to_snapshot(first).commit()  # a restore, by hand
    demo.ingest()  # the pipeline reads on from the restored head
    assert audit_status()["message"] == (
        f"not evaluated for this table (the last verdict, passed, is of snapshot {audited}, "
        "not in the table's history (its head moved off it): restored or rolled back outside "
        "the pipeline?); `platform status --audit` audits now"
    )

    (spec,) = load_pipelines()
    demo.catalog.drop_table(spec.table)  # with its quarantine table, which follows it
    if demo.catalog.table_exists(spec.quarantine_table):  # (the shared topic's bad records)
        demo.catalog.drop_table(spec.quarantine_table)
    assert audit_status()["message"].startswith(
        "not evaluated for this table (the last verdict, passed, is of a table that does not "
        "exist now: dropped?)"
    )
    demo.ingest()  # recreated: every record read again, into another table
    recreated = demo.catalog.load_table("demo.orders")
    assert audit_status()["message"].startswith(
        f"not evaluated for this table (the last verdict, passed, is of table UUID {uuid}, not "
        f"of this one ({recreated.metadata.table_uuid}): dropped and recreated, or replaced?)"
    )
    # An evaluation recorded before the UUID was: its cursor alone, not in this table.
    with DagsterInstance.from_config(str(home)) as instance:
        verdict = read_recorded_verdict(instance, spec, str(home))
    legacy = tie_to_table(replace(verdict, audited=AuditedTable(audited)), recreated)
    assert legacy.finding.skipped
    assert legacy.finding.message.startswith(
        f"not evaluated for this table (the last verdict, passed, is of snapshot {audited}, not "
        "in the table's history: recreated or restored?)"
    )

    # The next evaluation is of this table (its cursor memory, the old table's snapshot, reads
    # as expired: the audit says how it audited on, a caveat of this pass).
    fresh_run, _ = record_audit_evaluation(home, kafka, tmp_path, spark_resource)
    audit = status_json(capsys=capsys)["checks"][AUDIT]
    assert (audit["passed"], audit["skipped"], audit["run_id"]) == (True, False, fresh_run)


@pytest.mark.integration
def test_an_expired_cursor_is_a_caveat_and_a_restored_history_is_not_evaluated(
    demo: Demo,
    kafka: KafkaResource,
    tmp_path: Path,
    spark_resource: SparkResource,
    ledger_producer: LedgerProducer,
    demo_topic: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another engine expires the audited snapshot (R56; or ``platform maintain`` without the
    instance, or past the 24 h bound, R47): the table is the same one (its UUID), every snapshot
    left is newer than the cursor, so the pass stands, the expiry named as its caveat, never a
    false "not evaluated". The table then set back to its first snapshot, older than the cursor
    (a restore): not evaluated for this table."""
    home = make_instance_home(tmp_path)
    table = demo.catalog.load_table("demo.orders")
    first = head_id(table)
    ledger_producer.produce(demo_topic, orders(400, 3))
    demo.ingest()
    run_id, _ = record_audit_evaluation(home, kafka, tmp_path, spark_resource)
    audited = head_id(demo.catalog.load_table("demo.orders"))
    ledger_producer.produce(demo_topic, orders(500, 3))
    demo.ingest()
    table = demo.catalog.load_table("demo.orders")
    table.maintenance.expire_snapshots().by_ids([audited]).commit()
    assert table.metadata.snapshot_by_id(audited) is None

    audit = status_json(capsys=capsys)["checks"][AUDIT]
    assert (audit["passed"], audit["skipped"], audit["run_id"]) == (True, False, run_id)
    expired = (
        f"its last audited snapshot, {audited}, was expired since (the same table, UUID "
        f"{table.metadata.table_uuid}): the next evaluation audits on from it or says why it "
        "cannot"
    )
    assert audit["caveats"] == [expired]
    assert main(["status"]) == 0
    (line, *_) = audit_lines(capsys.readouterr().out)
    assert line.startswith(f"  {AUDIT}: passed with caveats "), line
    assert expired in line

    table.manage_snapshots().set_current_snapshot(first).commit()  # a restore, by hand
    demo.ingest()
    audit = status_json(capsys=capsys)["checks"][AUDIT]
    assert (audit["passed"], audit["skipped"]) == (False, True), audit
    assert audit["message"].startswith(
        f"not evaluated for this table (the last verdict, passed, is of snapshot {audited}, not "
        "in the table's history, which holds snapshots committed before it: restored from "
        "older metadata?)"
    ), audit["message"]


@pytest.mark.integration
def test_an_evaluation_that_did_not_finish_is_the_verdict(
    demo: Demo,
    kafka: KafkaResource,
    tmp_path: Path,
    spark_resource: SparkResource,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The checks' op raises (its catalog cannot be opened) after a pass: the run fails, the
    audit's execution stays planned without an evaluation. ``status`` reports that evaluation
    as not finished, naming its run and status, the pass before it as older context only;
    the next evaluation that finishes is the verdict again."""
    home = make_instance_home(tmp_path)
    passed_run, passed_s = record_audit_evaluation(home, kafka, tmp_path, spark_resource)
    not_a_folder = tmp_path / "not_a_folder"
    not_a_folder.write_text("")
    broken = evaluate_checks(home, kafka, not_a_folder, spark_resource)
    assert not broken.success
    (spec,) = load_pipelines()
    with DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_run_by_id(broken.run_id)
        assert run is not None
        assert run.status == DagsterRunStatus.FAILURE
        (newest, *_) = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(table_key(spec), AUDIT), limit=2
        )
    assert newest.run_id == broken.run_id
    assert newest.status == AssetCheckExecutionRecordStatus.PLANNED

    status = status_json(capsys=capsys)
    audit = status["checks"][AUDIT]
    assert (audit["passed"], audit["skipped"], audit["run_id"]) == (False, True, broken.run_id)
    assert AUDIT not in status["failing_checks"]
    assert audit["evaluated_at_ms"] == int(newest.create_timestamp * 1000)
    before = format_instant(int(passed_s * 1000))
    assert audit["message"].startswith(
        f"the last evaluation did not finish (run {broken.run_id}, FAILURE); older context, "
        f"not the current verdict: the evaluation before it passed at {before} (run "
        f"{passed_run}): "
    ), audit["message"]
    assert main(["status"]) == 0
    lines = audit_lines(capsys.readouterr().out)
    assert lines[0].startswith(f"  skipped {AUDIT}: not evaluated "), lines
    assert f"run {broken.run_id}" in lines[0]
    assert all(f"{AUDIT}: passed" not in line for line in lines), lines
    assert all("checks: all" not in line for line in lines), lines

    again, _ = record_audit_evaluation(home, kafka, tmp_path, spark_resource)
    audit = status_json(capsys=capsys)["checks"][AUDIT]
    assert (audit["passed"], audit["skipped"], audit["run_id"]) == (True, False, again)
