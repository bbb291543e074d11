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

A verdict is only as good as what it says and what it is of:

- a pass that did not cover everything (the audit's backlog, what it could not verify or
  recount: :func:`audit_caveats`) is printed "passed with caveats", with them, and counted so in
  the summary line (``caveats`` in ``--json``), never folded into ``checks: all N pass``;
- a recorded verdict is of the table it audited (:func:`tie_to_table`): the last audited
  snapshot (``audit_cursor``) must be in the table's history, and the table's UUID recorded at
  the evaluation its UUID. A table dropped and recreated, or restored, outside the pipeline is
  "not evaluated for this table" (skipped) until the next evaluation; a cursor expired since,
  on the same table (R47, R56: expiry by another tool), is a caveat, not a false "not
  evaluated";
- the newest execution is the verdict: one that ended without an evaluation (its op raised,
  its run was canceled) is "the last evaluation did not finish", skipped, and the verdict
  before it is named as older context only (:func:`read_recorded_verdict`).

Every verdict is taken first, then each pipeline's state is read and its figures measured from
the clock read after it (:func:`iter_statuses`): a slow audit cannot age them. Before, the state
was read before the audit and printed after it ("last commit: 83.8 s ago" for a stream that
commits every 3.8 s).

Nothing here writes: a status read again is a new reading, nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
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
from ingestion.health.status import Evaluated, PipelineStatus, build_status, format_instant
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import iter_ancestry
from platform_assets.alerts.policy import format_duration
from platform_assets.ingest.checks import audit_finding
from platform_assets.ingest.schedules import CHECKS_INTERVAL_SECONDS, CHECKS_SCHEDULE
from platform_assets.state import StateReader, read_pipeline_state
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

if TYPE_CHECKING:
    from dagster import AssetCheckEvaluation, DagsterInstance
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecord
    from pyiceberg.table import Table

AuditMode = Literal["recorded", "incremental", "full"]
"""Where ``status`` takes the exactly-once audit's verdict from: the last evaluation recorded in
the Dagster instance (the default), or an audit it runs now (``--audit``: the budgeted
incremental one; ``--full-audit``)."""

STALE_AFTER_S = 2 * CHECKS_INTERVAL_SECONDS
"""A recorded audit verdict older than this is stale: the checks schedule missed two ticks."""

VERDICT_SEARCH_LIMIT = 100
"""Check records read back for the last evaluation: past those of runs in progress."""

AUDIT_NOW_HINT = "`platform status --audit` audits now"


@dataclass(frozen=True)
class AuditedTable:
    """What a recorded evaluation says it audited (the check's metadata): the last audited
    snapshot (``audit_cursor``; None: none yet), and, recorded since status checks them
    (:func:`platform_assets.ingest.checks.audited_table_metadata`), the table's UUID
    (``table_uuid``) and when that snapshot was committed (``audit_cursor_ms``)."""

    snapshot_id: int | None
    table_uuid: str | None = None
    snapshot_ms: int | None = None


@dataclass(frozen=True)
class AuditVerdict:
    """The exactly-once audit's finding and when it was evaluated: by this command, or recorded
    in the Dagster instance (``evaluated.run_id``), or never (``evaluated.at_ms`` None). A pass
    names its ``caveats`` (:func:`audit_caveats`); a recorded evaluation what it ``audited``,
    to be tied to the table read after it (:func:`tie_to_table`)."""

    finding: Finding
    evaluated: Evaluated
    caveats: tuple[str, ...] = ()
    audited: AuditedTable | None = None


def audit_caveats(metadata: Mapping[str, Any], upsert: bool = False) -> tuple[str, ...]:
    """What a passing exactly-once audit did not cover, from the metadata the check writes
    (ingestion/audit/verdict.py): what it could not verify (``not_verified``: a cursor lost, the
    older commits of a first evaluation left out by the budget), the ranges a full audit could
    not recount (``not_recounted``: offsets Kafka's retention deleted, a pipeline with
    replicas), the backlog left for the next evaluation (``backlog_commits``), an ``upsert``
    table's full audit that checked only its rows against Kafka, and expired commits no range
    recount covered. Empty: the pass covers every commit it names.

    Example:
        >>> audit_caveats({"backlog_commits": 2, "backlog_offsets": 40, "not_verified": ""})
        ('2 commit(s) (40 offsets) not yet audited, left for the next evaluation',)
    """
    caveats = []
    if metadata.get("not_verified"):
        caveats.append(f"not verified: {metadata['not_verified']}")
    if metadata.get("not_recounted"):
        caveats.append(f"not recounted: {metadata['not_recounted']}")
    pending = _count(metadata, "backlog_commits")
    if pending:
        age = metadata.get("oldest_unaudited_age_s")
        oldest = f", the oldest {float(age):.0f} s old" if age is not None else ""
        caveats.append(
            f"{pending} commit(s) ({_count(metadata, 'backlog_offsets')} offsets) not yet "
            f"audited{oldest}, left for the next evaluation"
        )
    if "range_partitions_recounted" in metadata:  # a full audit's range recount
        recounted = _count(metadata, "range_partitions_recounted")
        if recounted and upsert:
            caveats.append(
                "mode: upsert: only the rows were checked against Kafka's records (a record "
                "whose key changed again or was deleted has no row)"
            )
        expired = metadata.get("expired_snapshots")  # absent: unknown (format v1)
        if not recounted and (expired is None or _count(metadata, "expired_snapshots")):
            caveats.append(
                "the commits of the expired snapshots are not audited (no range could be recounted)"
            )
    return tuple(caveats)


def _count(metadata: Mapping[str, Any], name: str) -> int:
    """A count of the check's metadata; 0 when absent or not a number."""
    try:
        return int(metadata.get(name) or 0)
    except (TypeError, ValueError):
        return 0


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
    upsert = spec.mode == "upsert"
    caveats = audit_caveats(finding.metadata, upsert) if finding.passed else ()
    return AuditVerdict(finding, Evaluated(int(time.time() * 1000), fresh=True), caveats)


def read_recorded_verdict(
    instance: DagsterInstance | None, spec: PipelineSpec, where: str
) -> AuditVerdict:
    """The pipeline's ``exactly_once_audit`` verdict recorded in ``instance`` (``where`` names
    it): its newest execution whose run has ended, with its time and run. A result "not
    evaluated" because the group check blocked is skipped, as it was. An execution that ended
    without an evaluation (the check's op raised, its run failed or was canceled) is the
    verdict, skipped: "the last evaluation did not finish", the evaluation before it given as
    older context only. Executions whose run is still going are passed over (the one before is
    the current verdict). Without ``instance`` (``where`` then says why) or any evaluation yet,
    the audit is skipped and named as not evaluated: never a pass. Reads only."""
    if instance is None:
        return never_evaluated(f"not evaluated yet: {where}; {AUDIT_NOW_HINT}")
    from dagster import AssetCheckEvaluation, AssetCheckKey

    from platform_assets.pipelines import table_key

    key = AssetCheckKey(table_key(spec), AUDIT_CHECK.name)
    history = instance.event_log_storage.get_asset_check_execution_history(
        key, limit=VERDICT_SEARCH_LIMIT
    )
    unfinished: tuple[AssetCheckExecutionRecord, str] | None = None
    for record in history:  # newest first
        evaluation = record.evaluation if record.event is not None else None
        if isinstance(evaluation, AssetCheckEvaluation):
            verdict = recorded_verdict(spec, record, evaluation)
            return verdict if unfinished is None else did_not_finish(*unfinished, verdict)
        if unfinished is None:  # planned: its run is going, or ended without an evaluation
            ended = run_outcome(instance, record.run_id)
            if ended is not None:
                unfinished = (record, ended)
    if unfinished is not None:
        return did_not_finish(*unfinished, None)
    return never_evaluated(
        f"not evaluated yet: no evaluation yet in the Dagster instance {where} "
        f"({CHECKS_SCHEDULE} evaluates it); {AUDIT_NOW_HINT}"
    )


def run_outcome(instance: DagsterInstance, run_id: str) -> str | None:
    """How the run of a check execution without an evaluation ended (its status: ``FAILURE``,
    ``CANCELED``, ``SUCCESS`` when the check yielded none), or None while it is going. A
    planned execution stays PLANNED in the event log whatever its run did (Dagster resolves it
    from the run when asked: ``AssetCheckExecutionRecord.resolve_status``)."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        return "its run was deleted"
    return run.status.value if run.is_finished else None


def recorded_verdict(
    spec: PipelineSpec, record: AssetCheckExecutionRecord, evaluation: AssetCheckEvaluation
) -> AuditVerdict:
    """The verdict of one recorded evaluation: its finding (with its metadata), time, run,
    caveats and what it audited."""
    assert record.event is not None  # an evaluation's record holds its event
    metadata = {name: value.value for name, value in evaluation.metadata.items()}
    blocked = "blocked_by" in metadata  # recorded as a WARN failure: it was skipped
    finding = Finding(
        passed=evaluation.passed and not blocked,
        severity="WARN" if evaluation.severity.value == "WARN" else "ERROR",
        message=evaluation.description or "",
        metadata=metadata,
        skipped=blocked,
    )
    evaluated = Evaluated(
        int(record.event.timestamp * 1000),
        fresh=False,
        run_id=record.run_id,
        stale_after_s=STALE_AFTER_S,
    )
    if blocked:
        return AuditVerdict(finding, evaluated)
    cursor, uuid, at = (str(metadata.get(k) or "") for k in AUDITED_KEYS)
    audited = AuditedTable(
        int(cursor) if cursor.isdigit() else None, uuid or None, int(at) if at.isdigit() else None
    )
    caveats = audit_caveats(metadata, spec.mode == "upsert") if finding.passed else ()
    return AuditVerdict(finding, evaluated, caveats, audited)


AUDITED_KEYS = ("audit_cursor", "table_uuid", "audit_cursor_ms")
"""The check's metadata that says what an evaluation audited (:class:`AuditedTable`)."""


def did_not_finish(
    record: AssetCheckExecutionRecord, ended: str, before: AuditVerdict | None
) -> AuditVerdict:
    """The verdict when the newest execution ended without an evaluation: skipped, at that
    execution's time and run; the evaluation ``before`` it is named as older context only."""
    message = f"the last evaluation did not finish (run {record.run_id}, {ended})"
    if ended == "SUCCESS":
        message = (
            f"the last evaluation recorded no verdict (run {record.run_id}, {ended}: the check "
            "yielded none, its run's log says why)"
        )
    if before is None:
        context = "no evaluation before it"
    else:
        at = before.evaluated.at_ms
        context = (
            f"older context, not the current verdict: the evaluation before it "
            f"{describe_outcome(before.finding)} at {format_instant(at or 0)} "
            f"(run {before.evaluated.run_id}): {before.finding.message}"
        )
    evaluated = Evaluated(
        int(record.create_timestamp * 1000),
        fresh=False,
        run_id=record.run_id,
        stale_after_s=STALE_AFTER_S,
    )
    return AuditVerdict(skipped(f"{message}; {context}; {AUDIT_NOW_HINT}"), evaluated)


def describe_outcome(finding: Finding) -> str:
    """``passed``, ``failed (SEVERITY)`` or ``was not evaluated``, as a verdict is named.

    Example:
        >>> from ingestion.health.checks import failed
        >>> describe_outcome(failed("WARN", "behind"))
        'failed (WARN)'
    """
    if finding.skipped:
        return "was not evaluated"
    return "passed" if finding.passed else f"failed ({finding.severity})"


def tie_to_table(verdict: AuditVerdict, table: Table | None) -> AuditVerdict:
    """``verdict`` when it is of ``table`` (the pipeline's table as the status read it, None
    when it does not exist), else skipped: "not evaluated for this table".

    A recorded evaluation is of the table whose history holds its last audited snapshot (the
    cursor): the lineage of the table's head, metadata already read, nothing reloaded. Its
    UUID, recorded at the evaluation, must be the table's (dropped and recreated: another
    one). The cursor can leave the table legitimately: snapshot expiry keeps the commits after
    it and the cursor itself (R47), but not past 24 h, nor another tool's expiry (R56), nor
    ``platform maintain`` run without the instance. So a cursor no longer in the table at all
    is checked the weaker way: the same UUID, and no snapshot in the history committed before
    it (an expiry removes the oldest snapshots; a history holding older ones is another,
    restored): the verdict stands, with the expiry as a caveat. An evaluation recorded before
    the UUID was (nothing tells an expiry from a recreation) is skipped until the next one.
    A verdict without ``audited`` (fresh, never evaluated, blocked) is returned as it is."""
    audited = verdict.audited
    if audited is None or verdict.finding.skipped:
        return verdict
    outcome = describe_outcome(verdict.finding)

    def not_this_table(why: str) -> AuditVerdict:
        message = f"not evaluated for this table (the last verdict, {outcome}, {why}?)"
        return AuditVerdict(skipped(f"{message}; {AUDIT_NOW_HINT}"), verdict.evaluated)

    if table is None:
        return not_this_table("is of a table that does not exist now: dropped")
    uuid = str(table.metadata.table_uuid)
    if audited.table_uuid is not None and audited.table_uuid != uuid:
        return not_this_table(
            f"is of table UUID {audited.table_uuid}, not of this one ({uuid}): dropped and "
            "recreated, or replaced"
        )
    cursor = audited.snapshot_id
    if cursor is None:  # nothing audited yet: the UUID is all there is to tie it
        return verdict
    lineage = list(iter_ancestry(table))
    if any(s.snapshot_id == cursor for s in lineage):
        return verdict
    if table.metadata.snapshot_by_id(cursor) is not None:
        return not_this_table(
            f"is of snapshot {cursor}, not in the table's history (its head moved off it): "
            "restored or rolled back outside the pipeline"
        )
    if audited.table_uuid is None:
        return not_this_table(
            f"is of snapshot {cursor}, not in the table's history: recreated or restored"
        )
    at = audited.snapshot_ms
    if at is not None and any(s.timestamp_ms < at for s in lineage):
        return not_this_table(
            f"is of snapshot {cursor}, not in the table's history, which holds snapshots "
            "committed before it: restored from older metadata"
        )
    expired = (
        f"its last audited snapshot, {cursor}, was expired since (the same table, UUID "
        f"{uuid}): the next evaluation audits on from it or says why it cannot"
    )
    return replace(verdict, caveats=(*verdict.caveats, expired))


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
    verdict; a recorded verdict is tied to the table the state was read from
    (:func:`tie_to_table`)."""
    if verdict is None and audit:
        verdict = audit_now(spec, kafka, iceberg, full=full_audit)
    replicas: dict[str, Finding] = {}
    if spec.replicas:  # the disaster-recovery add-on, for pipelines with replicas only
        from platform_assets.dr.checks import replica_finding

        for replica in spec.replicas:
            finding = replica_finding(spec, replica, kafka, iceberg)
            replicas[replica_check_def(replica).name] = finding
    with StateReader(kafka, iceberg) as reader:
        state, table = reader.read_with_table(spec, with_oldest=True)
    findings = evaluate_state_checks(state)
    evaluated: dict[str, Evaluated] = {}
    caveats: dict[str, tuple[str, ...]] = {}
    if verdict is not None and findings[GROUP_CHECK.name].blocks:
        findings[AUDIT_CHECK.name] = not_evaluated(state)
    elif verdict is not None:
        verdict = tie_to_table(verdict, table)  # a recorded one: of the table just read?
        findings[AUDIT_CHECK.name] = verdict.finding
        evaluated[AUDIT_CHECK.name] = verdict.evaluated
        caveats[AUDIT_CHECK.name] = verdict.caveats
    now_ms = int(time.time() * 1000)
    return build_status(state, {**findings, **replicas}, now_ms, evaluated, caveats)


def describe_check(name: str, check: Mapping[str, Any]) -> str | None:
    """The line ``platform status`` prints for one check of :attr:`PipelineStatus.checks`: a
    failure (``FAILING``), a check not evaluated (``skipped``), a pass with caveats (them, then
    its message), and a verdict recorded earlier with its age, time and run (STALE when old);
    None for a fresh pass without caveats (the summary names it).

    Example:
        >>> recorded = {"passed": True, "skipped": False, "severity": "ERROR", "message": "ok",
        ...     "caveats": [], "fresh": False, "evaluated_at": "2026-12-01T21:40:03Z",
        ...     "age_s": 240.0, "run_id": "5f1c", "stale": False, "stale_after_s": 600}
        >>> describe_check("exactly_once_audit", recorded)
        '  exactly_once_audit: passed 4 min ago (last evaluation at 2026-12-01T21:40:03Z, run 5f1c)'
        >>> noted = describe_check("exactly_once_audit", {**recorded, "caveats": ["1 left"]})
        >>> noted.replace("4 min ago (last evaluation at 2026-12-01T21:40:03Z, run 5f1c)", "_")
        '  exactly_once_audit: passed with caveats _: 1 left (ok)'
    """
    message, caveats = check["message"], check["caveats"]
    noted = f"{'; '.join(caveats)} ({message})"
    if check["fresh"] or check["evaluated_at"] is None:
        if check["skipped"]:
            return f"  skipped {name}: {message}"
        if check["passed"]:
            return f"  {name}: passed with caveats: {noted}" if caveats else None
        return f"  FAILING {name}: {message}"
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
    if check["passed"] and caveats:
        return f"  {name}: passed with caveats {when}: {noted}"
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
    noted = [describe_check(n, c) for n, c in checks if c["passed"]]  # None: fresh, clean
    for line in (*failing, *not_run, *noted):
        if line is not None:
            print(line)
    if not status.failing:
        ran = [name for name, check in checks if not check["skipped"]]
        caveated = [name for name, check in checks if check["passed"] and check["caveats"]]
        with_caveats = f", {len(caveated)} with caveats ({', '.join(caveated)})" if caveated else ""
        print(f"  checks: all {len(ran)} pass ({', '.join(ran)}){with_caveats}")
