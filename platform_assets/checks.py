"""The table's asset checks: the engine's checks (:mod:`ingestion.checks`), as Dagster results.

Nothing is evaluated here: this module reads through the resources, asks the engine's check
functions, and translates each finding into an ``AssetCheckResult``. The blocking
``group_id_consistency`` check is declared on the ingestion multi-asset (it must run before
ingestion, see assets.py); the others are here.
"""

from collections.abc import Iterator

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    multi_asset_check,
)

from ingestion.audit import audit_pipeline
from ingestion.checks import (
    ALL_CHECKS,
    AUDIT_CHECK,
    GROUP_CHECK,
    STATE_CHECKS,
    CheckDef,
    Finding,
    check_exactly_once,
    check_group_consistency,
    failed,
)
from ingestion.spec import PipelineSpec
from platform_assets.pipelines import table_key
from platform_assets.state import read_pipeline_state
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def audit_finding(
    spec: PipelineSpec, iceberg: IcebergCatalogResource, kafka: KafkaResource
) -> Finding:
    """The exactly-once audit of the pipeline's table (reads the table and recounts Kafka)."""
    audit, newest = audit_pipeline(spec, iceberg.load_catalog(), kafka.client_config())
    return check_exactly_once(spec.table, audit, newest)


def not_evaluated(spec: PipelineSpec) -> Finding:
    """What the table's other checks report while the blocking group check fails: read under
    a group id that holds no progress, their figures (lag, commits, audit range) would be
    false. ``blocked_by`` tells the alert policy this is no failure of its own."""
    return failed(
        "WARN",
        f"not evaluated: ingestion of {spec.name!r} is blocked by {GROUP_CHECK.name}, so the "
        f"offsets under {spec.consumer_group_id!r} say nothing about the pipeline. "
        f"Fix {GROUP_CHECK.name} first (its message says how).",
        {"blocked_by": GROUP_CHECK.name},
    )


def to_result(spec: PipelineSpec, name: str, finding: Finding) -> AssetCheckResult:
    """A check result from a (not skipped) finding."""
    return AssetCheckResult(
        asset_key=table_key(spec),
        check_name=name,
        passed=finding.passed,
        severity=AssetCheckSeverity(finding.severity),
        description=finding.message,
        metadata=finding.metadata,
    )


def check_spec(spec: PipelineSpec, check: CheckDef, blocking: bool = False) -> AssetCheckSpec:
    """The Dagster spec of one of the engine's checks on the pipeline's table."""
    return AssetCheckSpec(
        check.name, asset=table_key(spec), description=check.description, blocking=blocking
    )


def pipeline_check_keys(spec: PipelineSpec) -> list[AssetCheckKey]:
    """Every check of the pipeline's table, the blocking group check included."""
    return [AssetCheckKey(table_key(spec), check.name) for check in ALL_CHECKS]


def build_pipeline_checks(spec: PipelineSpec) -> AssetChecksDefinition:
    """The table asset's checks (all but the blocking group check).

    A check that cannot be evaluated (the audit before the table exists) yields no result: the
    run logs why and Dagster records the check as skipped.
    """
    specs = [check_spec(spec, check) for check in (*STATE_CHECKS, AUDIT_CHECK)]

    @multi_asset_check(name=f"{spec.name}_checks", specs=specs, can_subset=True)
    def _checks(
        context: AssetCheckExecutionContext, kafka: KafkaResource, iceberg: IcebergCatalogResource
    ) -> Iterator[AssetCheckResult]:
        selected = {key.name for key in context.selected_asset_check_keys}
        findings: dict[str, Finding] = {}
        state = read_pipeline_state(spec, kafka, iceberg)
        if check_group_consistency(state).blocks:
            # Read under a group id that holds no progress, every figure would be false.
            findings = {name: not_evaluated(spec) for name in sorted(selected)}
        else:
            for check in STATE_CHECKS:
                if check.name in selected and check.evaluate is not None:
                    findings[check.name] = check.evaluate(state)
            if AUDIT_CHECK.name in selected:
                findings[AUDIT_CHECK.name] = audit_finding(spec, iceberg, kafka)
        for name, finding in findings.items():
            if finding.skipped:
                context.log.info(f"{name} skipped: {finding.message}")
            else:
                yield to_result(spec, name, finding)

    return _checks
