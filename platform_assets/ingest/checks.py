"""The table's asset checks: the engine's checks (:mod:`ingestion.health.checks`), as Dagster
results.

Nothing is evaluated here: this module reads through the resources, asks the engine's check
functions, and translates each finding into an ``AssetCheckResult``. The blocking
``group_id_consistency`` check is declared on the ingestion multi-asset (it must run before
ingestion, see assets.py); the others are here.
"""

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    DagsterInstance,
    multi_asset_check,
)

from ingestion.audit.incremental import AuditMemory
from ingestion.audit.oracle import audit_pipeline
from ingestion.audit.verdict import check_exactly_once
from ingestion.health.checks import (
    ALL_CHECKS,
    AUDIT_CHECK,
    GROUP_CHECK,
    STATE_CHECKS,
    CheckDef,
    Finding,
    evaluate_state_checks,
    not_evaluated,
    replica_check_def,
)
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import decode_positions, encode_positions
from platform_assets.pipelines import table_key
from platform_assets.state import read_pipeline_state
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def audit_finding(
    spec: PipelineSpec,
    iceberg: IcebergCatalogResource,
    kafka: KafkaResource,
    *,
    previous: AuditMemory | None = None,
    full: bool = False,
) -> Finding:
    """The exactly-once audit of the pipeline's table: the commits after the ``previous``
    evaluation's cursor recounted in Kafka (a commit it could not recount is retried, counted
    on from ``previous``), or (``full``) every commit and every row's coordinates."""
    clusters = {"primary": kafka.client_config()}
    for replica in spec.replicas:  # each commit is recounted on the cluster it read
        clusters[replica.name] = kafka.for_cluster(replica.name).client_config()
    audit = audit_pipeline(
        spec,
        iceberg.load_catalog(),
        kafka.client_config(),
        after_snapshot_id=previous.cursor if previous else None,
        cursor_offsets=previous.cursor_offsets if previous else None,
        full=full,
        cluster_configs=clusters if spec.replicas else None,
    )
    return check_exactly_once(spec.table, audit, previous)


MEMORY_SEARCH_LIMIT = 100  # check records read back for the audit's memory


def previous_audit_memory(instance: DagsterInstance, key: AssetCheckKey) -> AuditMemory | None:
    """What the check's last completed evaluation left: its ``audit_cursor``, and the commit it
    could not recount with ``recount_attempts`` (None: audit afresh).

    The memory lives in the check's own results, so it follows the check wherever Dagster
    stores its history. Every result carries it: an evaluation writes the new one, a result
    "not evaluated" while the group check blocks carries the previous one on
    (:func:`memory_metadata`). Before, blocked results carried none, so after ten of them the
    cursor was gone, maintenance kept nothing for the audit and the audit restarted at the
    newest commits and passed (R47). The search reads up to
    :data:`MEMORY_SEARCH_LIMIT` records past executions that yielded no result (the table did
    not exist yet).
    """
    history = instance.event_log_storage.get_asset_check_execution_history(
        key, limit=MEMORY_SEARCH_LIMIT
    )
    for record in history:
        event = record.event.dagster_event if record.event else None
        metadata = getattr(event.event_specific_data, "metadata", None) if event else None
        if metadata and "audit_cursor" in metadata:  # an evaluation (not a planned one)
            break
    else:
        return None

    def number(name: str) -> int | None:
        text = str(metadata[name].value) if name in metadata else ""
        return int(text) if text.isdigit() else None

    offsets = (
        str(metadata["audit_cursor_offsets"].value) if "audit_cursor_offsets" in metadata else ""
    )
    return AuditMemory(
        cursor=number("audit_cursor"),
        unrecounted_snapshot=number("unrecounted_snapshot"),
        attempts=number("recount_attempts") or 0,
        group=str(metadata["audit_group"].value) if "audit_group" in metadata else None,
        cursor_offsets=decode_positions(offsets) if offsets else None,
    )


def memory_metadata(memory: AuditMemory | None) -> dict[str, str]:
    """The check metadata that hands ``memory`` to the next evaluation (empty without one)."""
    if memory is None:
        return {}
    carried = {"audit_cursor": "" if memory.cursor is None else str(memory.cursor)}
    if memory.group is not None:
        carried["audit_group"] = memory.group
    if memory.cursor_offsets is not None:
        carried["audit_cursor_offsets"] = encode_positions(memory.cursor_offsets)
    if memory.unrecounted_snapshot is not None:
        carried["unrecounted_snapshot"] = str(memory.unrecounted_snapshot)
        carried["recount_attempts"] = str(memory.attempts)
    return carried


def audited_table_metadata(
    spec: PipelineSpec, iceberg: IcebergCatalogResource, metadata: dict[str, Any]
) -> dict[str, str]:
    """What ties an evaluation to the table it audited, for ``platform status``
    (platform_assets/cli/status.py): the table's UUID (``table_uuid``: a table dropped and
    recreated has another) and when the cursor's snapshot was committed (``audit_cursor_ms``:
    after the cursor is expired, a history holding older snapshots is another one, restored).
    Read from the table loaded after the audit; empty when it no longer holds the cursor (it
    changed under the audit: nothing is claimed)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = iceberg.load_catalog().load_table(spec.table)
    except NoSuchTableError:
        return {}
    cursor = str(metadata.get("audit_cursor", ""))
    snapshot = table.metadata.snapshot_by_id(int(cursor)) if cursor.isdigit() else None
    if cursor and snapshot is None:
        return {}
    tied = {"table_uuid": str(table.metadata.table_uuid)}
    if snapshot is not None:
        tied["audit_cursor_ms"] = str(snapshot.timestamp_ms)
    return tied


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
    checks = [*ALL_CHECKS, *(replica_check_def(r) for r in spec.replicas)]
    return [AssetCheckKey(table_key(spec), check.name) for check in checks]


def build_pipeline_checks(spec: PipelineSpec) -> AssetChecksDefinition:
    """The table asset's checks (all but the blocking group check).

    A check that cannot be evaluated (the audit before the table exists) yields no result: the
    run logs why and Dagster records the check as skipped.
    """
    replicas = {replica_check_def(r).name: r for r in spec.replicas}
    defs = (*STATE_CHECKS, AUDIT_CHECK, *(replica_check_def(r) for r in spec.replicas))
    specs = [check_spec(spec, check) for check in defs]

    @multi_asset_check(name=f"{spec.name}_checks", specs=specs, can_subset=True)
    def _checks(
        context: AssetCheckExecutionContext, kafka: KafkaResource, iceberg: IcebergCatalogResource
    ) -> Iterator[AssetCheckResult]:
        selected = {key.name for key in context.selected_asset_check_keys}
        state = read_pipeline_state(spec, kafka, iceberg, with_oldest=True)
        evaluated = evaluate_state_checks(state)
        findings = {name: f for name, f in evaluated.items() if name in selected}
        if AUDIT_CHECK.name in selected:
            key = AssetCheckKey(table_key(spec), AUDIT_CHECK.name)
            previous = previous_audit_memory(context.instance, key)
            if evaluated[GROUP_CHECK.name].blocks:  # the memory is carried on, never dropped
                blocked = not_evaluated(state)
                findings[AUDIT_CHECK.name] = replace(
                    blocked, metadata={**blocked.metadata, **memory_metadata(previous)}
                )
            else:
                group = spec.consumer_group_id
                if previous is not None and previous.group not in (None, group):
                    # a migration: the cursor walks another group's commits (each would read
                    # as another writer's); the audit starts again under the new group
                    context.log.warning(
                        f"exactly_once_audit: the last cursor audited group {previous.group!r}, "
                        f"the pipeline now commits under {group!r}: auditing afresh"
                    )
                    previous = None
                found = audit_finding(spec, iceberg, kafka, previous=previous)
                tied = audited_table_metadata(spec, iceberg, found.metadata)
                findings[AUDIT_CHECK.name] = replace(
                    found, metadata={**found.metadata, "audit_group": group, **tied}
                )
        for name, replica in replicas.items():  # a pipeline with replicas only: the DR add-on
            if name in selected:
                from platform_assets.dr.checks import replica_finding

                findings[name] = replica_finding(spec, replica, kafka, iceberg)
        for name, finding in findings.items():
            if finding.skipped and "blocked_by" not in finding.metadata:
                context.log.info(f"{name} skipped: {finding.message}")  # e.g. no table yet
            else:
                yield to_result(spec, name, finding)

    return _checks
