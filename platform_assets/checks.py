"""Asset checks on each pipeline's table, evaluated from one read of the pipeline's state.

The blocking ``group_id_consistency`` check lives on the ingestion multi-asset (it must run
before ingestion); the others are here. Each message says what is wrong and how to fix it.
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

from ingestion.audit import audit_table, verify_latest_commit
from ingestion.health import Finding, check_group_consistency
from ingestion.spec import PipelineSpec
from ingestion.status import GROUP_CHECK, STATE_CHECKS
from platform_assets.pipelines import table_key
from platform_assets.state import read_pipeline_state
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

AUDIT_CHECK = "exactly_once_audit"


def audit_finding(
    spec: PipelineSpec, iceberg: IcebergCatalogResource, kafka: KafkaResource
) -> Finding:
    """The oracle in production: duplicates, regressions, shared files and overruns from the
    metadata columns and the snapshot lineage, and the newest commit's record count against an
    independent read_committed count of its ranges in Kafka."""
    catalog = iceberg.load_catalog()
    if not catalog.table_exists(spec.table):
        return Finding(True, "ERROR", "the table does not exist yet", {})
    quarantine = None
    if catalog.table_exists(spec.effective_quarantine_table):
        quarantine = catalog.load_table(spec.effective_quarantine_table)
    table = catalog.load_table(spec.table)
    result = audit_table(table, spec.effective_commit_group_id, quarantine)
    counted, counting = verify_latest_commit(
        table, spec.effective_commit_group_id, kafka.client_config(), spec.name
    )
    metadata = {
        "rows": result.rows,
        "quarantined": result.quarantined,
        "duplicates": len(result.duplicates),
        "regressions": len(result.regressions),
        "duplicate_files": len(result.duplicate_files),
        "newest_commit_count": counting,
    }
    if counted is False:
        result.commit_mismatches.append(counting)
    if result.ok:
        return Finding(
            True, "ERROR", f"each (topic, partition, offset) once: {result.summary()}", metadata
        )
    return Finding(
        False,
        "ERROR",
        (
            f"exactly-once violated: {result.summary()}. Stop the pipeline's runs, keep the "
            "snapshots, and inspect the listed coordinates and snapshots."
        ),
        metadata,
    )


def not_evaluated(spec: PipelineSpec) -> Finding:
    """What the table's other checks report while the blocking group check fails: read under
    a group id that holds no progress, their figures (lag, commits, audit range) would be
    false. ``blocked_by`` tells the alert policy this is no failure of its own."""
    return Finding(
        False,
        "WARN",
        (
            f"not evaluated: ingestion of {spec.name!r} is blocked by {GROUP_CHECK}, so the "
            f"offsets under {spec.effective_commit_group_id!r} say nothing about the pipeline. "
            f"Fix {GROUP_CHECK} first (its message says how)."
        ),
        {"blocked_by": GROUP_CHECK},
    )


def to_result(spec: PipelineSpec, name: str, finding: Finding) -> AssetCheckResult:
    """A check result from a finding."""
    return AssetCheckResult(
        asset_key=table_key(spec),
        check_name=name,
        passed=finding.passed,
        severity=AssetCheckSeverity(finding.severity),
        description=finding.message,
        metadata=finding.metadata,
    )


def pipeline_check_keys(spec: PipelineSpec) -> list[AssetCheckKey]:
    """Every check of the pipeline's table, the blocking group check included."""
    names = [GROUP_CHECK, *STATE_CHECKS, AUDIT_CHECK]
    return [AssetCheckKey(table_key(spec), name) for name in names]


def build_pipeline_checks(spec: PipelineSpec) -> AssetChecksDefinition:
    """The table asset's checks (all but the blocking group check)."""
    specs = [
        AssetCheckSpec(name, asset=table_key(spec), description=description)
        for name, (description, _) in STATE_CHECKS.items()
    ]
    specs.append(
        AssetCheckSpec(
            AUDIT_CHECK,
            asset=table_key(spec),
            description=(
                "No duplicate (topic, partition, offset), offset regression or shared file."
            ),
        )
    )

    @multi_asset_check(name=f"{spec.name}_checks", specs=specs, can_subset=True)
    def _checks(
        context: AssetCheckExecutionContext, kafka: KafkaResource, iceberg: IcebergCatalogResource
    ) -> Iterator[AssetCheckResult]:
        selected = {key.name for key in context.selected_asset_check_keys}
        state = read_pipeline_state(spec, kafka, iceberg)
        group = check_group_consistency(state)
        if not group.passed and group.severity == "ERROR":
            for name in sorted(selected):  # every figure would be read under the wrong group
                yield to_result(spec, name, not_evaluated(spec))
            return
        for name, (_, evaluate) in STATE_CHECKS.items():
            if name in selected:
                yield to_result(spec, name, evaluate(state))
        if AUDIT_CHECK in selected:
            yield to_result(spec, AUDIT_CHECK, audit_finding(spec, iceberg, kafka))

    return _checks
