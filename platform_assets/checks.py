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
    evaluate_state_checks,
    not_evaluated,
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


def to_result(spec: PipelineSpec, name: str, finding: Finding) -> AssetCheckResult:
    """A check result from a finding. A check skipped because ingestion is blocked is shown as
    a WARN failure that says why (Dagster records no reason for a skipped check); its
    ``blocked_by`` metadata keeps it out of the alerts."""
    return AssetCheckResult(
        asset_key=table_key(spec),
        check_name=name,
        passed=finding.passed,
        severity=AssetCheckSeverity("WARN" if finding.skipped else finding.severity),
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
        state = read_pipeline_state(spec, kafka, iceberg)
        evaluated = evaluate_state_checks(state)
        findings = {name: f for name, f in evaluated.items() if name in selected}
        if AUDIT_CHECK.name in selected:
            blocked = evaluated[GROUP_CHECK.name].blocks
            findings[AUDIT_CHECK.name] = (
                not_evaluated(state) if blocked else audit_finding(spec, iceberg, kafka)
            )
        for name, finding in findings.items():
            if finding.skipped and "blocked_by" not in finding.metadata:
                context.log.info(f"{name} skipped: {finding.message}")  # e.g. no table yet
            else:
                yield to_result(spec, name, finding)

    return _checks
