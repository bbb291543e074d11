"""``platform status``: each pipeline's offsets, lag, commits and checks, every age taken when it
is printed, and the exactly-once audit's verdict with when it was taken.

The audit recounts the newest commits in Kafka: seconds to minutes on a busy table, where
``kafka-consumer-groups --describe`` answers in a second. So ``status`` does not run it unless
asked. By default it reports the last evaluation of the asset check ``exactly_once_audit``
recorded in the Dagster instance (``DAGSTER_HOME``, else the embedded stack's, as
:func:`platform_assets.cli.actions.dagster_home` finds it; the checks schedule evaluates it every
five minutes), with its time and run, and says that it is stale when it is older than twice the
schedule's interval; without an instance, or before any evaluation, the audit is skipped and
named as not evaluated (never a pass). ``--audit`` runs the budgeted incremental audit now,
``--full-audit`` the full one.

Every verdict is taken first, then each pipeline's state is read and its figures measured from
the clock read after it (:func:`iter_statuses`): a slow audit cannot age them. Before, the state
was read before the audit and printed after it ("last commit: 83.8 s ago" for a stream that
commits every 3.8 s).

Nothing here writes: a status read again is a new reading, nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ingestion.health.checks import (
    AUDIT_CHECK,
    GROUP_CHECK,
    Finding,
    check_group_consistency,
    evaluate_state_checks,
    not_evaluated,
    replica_check_def,
    skipped,
)
from ingestion.health.status import Evaluated, PipelineStatus, build_status
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.alerts.policy import format_duration
from platform_assets.ingest.checks import audit_finding
from platform_assets.ingest.schedules import CHECKS_INTERVAL_SECONDS, CHECKS_SCHEDULE
from platform_assets.state import read_pipeline_state
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

if TYPE_CHECKING:
    from dagster import DagsterInstance

AuditMode = Literal["recorded", "incremental", "full"]
"""Where ``status`` takes the exactly-once audit's verdict from: the last evaluation recorded in
the Dagster instance (the default), or an audit it runs now (``--audit``: the budgeted
incremental one; ``--full-audit``)."""

STALE_AFTER_S = 2 * CHECKS_INTERVAL_SECONDS
"""A recorded audit verdict older than this is stale: the checks schedule missed two ticks."""

VERDICT_SEARCH_LIMIT = 100
"""Check records read back for the last evaluation: past those of runs in progress and of runs
that yielded no result (the table did not exist yet)."""

AUDIT_NOW_HINT = "`platform status --audit` audits now"


@dataclass(frozen=True)
class AuditVerdict:
    """The exactly-once audit's finding and when it was evaluated: by this command, or recorded
    in the Dagster instance (``evaluated.run_id``), or never (``evaluated.at_ms`` None)."""

    finding: Finding
    evaluated: Evaluated


def audit_now(
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    full: bool = False,
) -> AuditVerdict:
    """Run the exactly-once audit now: the newest commits recounted in Kafka within the budget
    (``audit_recount_offsets``), or (``full``) every commit and every row's coordinates. While
    the blocking group check fails it is not evaluated (the offsets under the group say nothing).

    Reads only (no cursor is kept: the Dagster check keeps its own); run again, it audits again.
    """
    state = read_pipeline_state(spec, kafka, iceberg)  # for the group check only
    if check_group_consistency(state).blocks:
        return AuditVerdict(not_evaluated(state), Evaluated(state.read_at_ms, fresh=True))
    finding = audit_finding(spec, iceberg, kafka, full=full)
    return AuditVerdict(finding, Evaluated(int(time.time() * 1000), fresh=True))


def read_recorded_verdict(
    instance: DagsterInstance | None, spec: PipelineSpec, where: str
) -> AuditVerdict:
    """The last completed evaluation of the pipeline's ``exactly_once_audit`` check in
    ``instance`` (``where`` names it), with its time and run; a result "not evaluated" because
    the group check blocked is skipped, as it was. Without ``instance`` (``where`` then says
    why) or any evaluation yet, the audit is skipped and named as not evaluated: never a pass.
    Reads only."""
    if instance is None:
        return never_evaluated(f"not evaluated yet: {where}; {AUDIT_NOW_HINT}")
    from dagster import AssetCheckEvaluation, AssetCheckKey

    from platform_assets.pipelines import table_key

    key = AssetCheckKey(table_key(spec), AUDIT_CHECK.name)
    history = instance.event_log_storage.get_asset_check_execution_history(
        key, limit=VERDICT_SEARCH_LIMIT
    )
    # Newest first; a planned one (its run in progress, or it yielded no result) holds none.
    found = next(
        (
            (record.event.timestamp, record.run_id, record.evaluation)
            for record in history
            if record.event is not None and isinstance(record.evaluation, AssetCheckEvaluation)
        ),
        None,
    )
    if found is None:
        return never_evaluated(
            f"not evaluated yet: no evaluation yet in the Dagster instance {where} "
            f"({CHECKS_SCHEDULE} evaluates it); {AUDIT_NOW_HINT}"
        )
    timestamp, run_id, evaluation = found
    blocked = "blocked_by" in evaluation.metadata  # recorded as a WARN failure: it was skipped
    finding = Finding(
        passed=evaluation.passed and not blocked,
        severity="WARN" if evaluation.severity.value == "WARN" else "ERROR",
        message=evaluation.description or "",
        skipped=blocked,
    )
    evaluated = Evaluated(
        int(timestamp * 1000), fresh=False, run_id=run_id, stale_after_s=STALE_AFTER_S
    )
    return AuditVerdict(finding, evaluated)


def never_evaluated(message: str) -> AuditVerdict:
    """An audit that was never evaluated: skipped, and why."""
    return AuditVerdict(skipped(message), Evaluated(None, fresh=False))


def read_recorded_verdicts(
    specs: list[PipelineSpec], iceberg: IcebergCatalogResource
) -> dict[str, AuditVerdict]:
    """Each pipeline's recorded audit verdict (:func:`read_recorded_verdict`), from the one
    Dagster instance of :func:`platform_assets.cli.actions.dagster_home`. An instance that
    cannot be read is named in each verdict: ``status`` still answers."""
    from platform_assets.cli.actions import dagster_home

    home = dagster_home(iceberg)
    if not home:
        missing = "no Dagster instance (DAGSTER_HOME unset)"
        return {spec.name: read_recorded_verdict(None, spec, missing) for spec in specs}
    from dagster import DagsterInstance

    try:
        with DagsterInstance.from_config(home) as instance:
            return {spec.name: read_recorded_verdict(instance, spec, home) for spec in specs}
    except Exception as exc:  # any storage's own errors: the figures are still worth showing
        unreadable = f"the Dagster instance {home} could not be read ({type(exc).__name__}: {exc})"
        return {spec.name: read_recorded_verdict(None, spec, unreadable) for spec in specs}


def take_verdicts(
    specs: list[PipelineSpec],
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    mode: AuditMode,
) -> dict[str, AuditVerdict]:
    """Every pipeline's audit verdict by ``mode``: read from the Dagster instance, or audited
    now, one pipeline after the other."""
    if mode == "recorded":
        return read_recorded_verdicts(specs, iceberg)
    return {spec.name: audit_now(spec, kafka, iceberg, full=mode == "full") for spec in specs}


def iter_statuses(
    specs: list[PipelineSpec],
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    mode: AuditMode = "recorded",
) -> Iterator[PipelineStatus]:
    """``platform status``: every verdict first (:func:`take_verdicts`), then each pipeline's
    status assembled when it is asked for (:func:`pipeline_status`), so a caller that prints each
    at once prints ages taken a moment before."""
    verdicts = take_verdicts(specs, kafka, iceberg, mode)
    for spec in specs:
        yield pipeline_status(spec, kafka, iceberg, verdict=verdicts[spec.name])


def pipeline_status(
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    audit: bool = True,
    full_audit: bool = False,
    *,
    verdict: AuditVerdict | None = None,
) -> PipelineStatus:
    """One pipeline's status, every check included. The audit's finding is ``verdict`` (taken
    before: :func:`audit_now` or :func:`read_recorded_verdict`); without one, the audit runs now
    (``audit``: the newest commits recounted in Kafka within a budget; ``full_audit``: every
    commit and every row's coordinates), or is left out (not ``audit``).

    The slow parts come first (the audit, the replicas' readiness), then the state is read and
    every age is measured from the clock read after it: the figures are those of now, not of
    before the audit. While the group check blocks, the audit is not evaluated, whatever the
    verdict."""
    if verdict is None and audit:
        verdict = audit_now(spec, kafka, iceberg, full=full_audit)
    replicas: dict[str, Finding] = {}
    if spec.replicas:  # the disaster-recovery add-on, for pipelines with replicas only
        from platform_assets.dr.checks import replica_finding

        for replica in spec.replicas:
            finding = replica_finding(spec, replica, kafka, iceberg)
            replicas[replica_check_def(replica).name] = finding
    state = read_pipeline_state(spec, kafka, iceberg, with_oldest=True)
    findings = evaluate_state_checks(state)
    evaluated: dict[str, Evaluated] = {}
    if verdict is not None and findings[GROUP_CHECK.name].blocks:
        findings[AUDIT_CHECK.name] = not_evaluated(state)
    elif verdict is not None:
        findings[AUDIT_CHECK.name] = verdict.finding
        evaluated[AUDIT_CHECK.name] = verdict.evaluated
    return build_status(state, {**findings, **replicas}, int(time.time() * 1000), evaluated)


def describe_check(name: str, check: Mapping[str, Any]) -> str | None:
    """The line ``platform status`` prints for one check of :attr:`PipelineStatus.checks`: a
    failure (``FAILING``), a check not evaluated (``skipped``), and a verdict recorded earlier
    with its age, time and run (STALE when old); None for a fresh pass (the summary names it).

    Example:
        >>> recorded = {"passed": True, "skipped": False, "severity": "ERROR", "message": "ok",
        ...     "fresh": False, "evaluated_at": "2026-12-01T21:40:03Z", "age_s": 240.0,
        ...     "run_id": "5f1c", "stale": False, "stale_after_s": 600}
        >>> describe_check("exactly_once_audit", recorded)
        '  exactly_once_audit: passed 4 min ago (last evaluation at 2026-12-01T21:40:03Z, run 5f1c)'
    """
    message = check["message"]
    if check["fresh"] or check["evaluated_at"] is None:
        if check["skipped"]:
            return f"  skipped {name}: {message}"
        return None if check["passed"] else f"  FAILING {name}: {message}"
    when = (
        f"{format_duration(check['age_s'])} ago (last evaluation at {check['evaluated_at']}, "
        f"run {check['run_id']})"
    )
    if check["stale"]:
        when += (
            f", STALE: older than {format_duration(check['stale_after_s'])}, twice the interval "
            f"of {CHECKS_SCHEDULE} (is it running?); {AUDIT_NOW_HINT}"
        )
    if check["skipped"]:
        return f"  skipped {name}: not evaluated {when}: {message}"
    if check["passed"]:
        return f"  {name}: passed {when}"
    return f"  FAILING {name}: failed ({check['severity']}) {when}: {message}"


def print_status(status: PipelineStatus) -> None:
    """The status as a terminal table; its ages are those of ``status.as_of_ms``."""
    oldest = status.oldest_uncommitted_age_s
    print(f"{status.pipeline}  table={status.table}  group={status.group_id}")
    print(
        f"  lag: {status.lag_records} records"
        + (f" (oldest uncommitted {oldest} s old)" if oldest is not None else "")
        + f"   last commit: {status.last_commit_age_s} s ago"
        + f"   valid through: {status.valid_through}"
    )
    if status.future_timestamps:
        print(f"  untrusted (future) timestamps: {status.future_timestamps}")
    print(f"  {'partition':<20} {'committed':>10} {'end':>10} {'mirror':>10} {'lag':>8}  oldest")
    for p in status.partitions:
        age = f"{p.oldest_uncommitted_age_s} s" if p.oldest_uncommitted_age_s is not None else "-"
        print(
            f"  {p.partition:<20} {p.committed!s:>10} {p.end:>10} {p.mirrored!s:>10} {p.lag:>8}"
            f"  {age}"
        )
    if status.commits:
        print(
            f"  {'commit (newest first)':<26} {'records':>8} {'ins':>7} {'upd':>7} {'del':>7}  dead"
        )
        for c in status.commits:
            print(
                f"  {c['committed_at']:<26} {c['records']:>8} {c['inserts']:>7} "
                f"{c['updates']:>7} {c['deletes']:>7}  {c['quarantined']}"
            )
    checks = status.checks.items()
    failing = [describe_check(n, c) for n, c in checks if n in status.failing]
    not_run = [describe_check(n, c) for n, c in checks if c["skipped"]]
    recorded = [describe_check(n, c) for n, c in checks if c["passed"] and not c["fresh"]]
    for line in (*failing, *not_run, *recorded):
        if line is not None:
            print(line)
    if not status.failing:
        ran = [name for name, check in checks if not check["skipped"]]
        print(f"  checks: all {len(ran)} pass ({', '.join(ran)})")
