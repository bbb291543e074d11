"""Every check of a pipeline, in one place: its name, what it means, and its evaluation.

Each ``check_*`` function is pure: it takes what was read (a :class:`PipelineState`, or the
audit's result) and returns a :class:`Finding` whose message says what is wrong and how to fix
it. The Dagster asset checks, the lag sensor and ``platform status`` all evaluate these same
functions, so they never disagree on what a check means. The exactly-once audit's verdict is
:func:`ingestion.audit.verdict.check_exactly_once`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ingestion.health.lag import measure_lag_age
from ingestion.health.state import PipelineState
from ingestion.spec.replicas import ReplicaSpec
from ingestion.table.offsets import describe_commit
from ingestion.table.rewind import explain_ahead

Severity = Literal["ERROR", "WARN"]
ACTIVE_GROUP_STATES = {"STABLE", "PREPARING_REBALANCE", "COMPLETING_REBALANCE"}


@dataclass(frozen=True, kw_only=True)
class Finding:
    """The outcome of one check: passed or not, how bad a failure is, why, figures for the UI.

    ``skipped`` means the check could not be evaluated (``message`` says why); it neither
    passes nor fails.
    """

    passed: bool
    severity: Severity = "ERROR"
    message: str
    metadata: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False

    @property
    def blocks(self) -> bool:
        """A failure of ERROR severity (a blocking check's failure stops ingestion).

        Example:
            >>> failed("ERROR", "x").blocks, failed("WARN", "x").blocks, passed("x").blocks
            (True, False, False)
        """
        return not self.passed and not self.skipped and self.severity == "ERROR"

    @property
    def fingerprint(self) -> str:
        """Stable while the cause is the same: messages name ids and partitions, never offsets
        or times, so a new fingerprint means a new cause (or its fix). Sensors act once per
        fingerprint.

        Example:
            >>> failed("ERROR", "a").fingerprint == failed("ERROR", "a").fingerprint
            True
            >>> failed("ERROR", "a").fingerprint == failed("ERROR", "b").fingerprint
            False
        """
        text = f"{self.passed}|{self.severity}|{self.message}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def passed(message: str, metadata: dict[str, Any] | None = None) -> Finding:
    """A passing finding."""
    return Finding(passed=True, message=message, metadata=metadata or {})


def failed(severity: Severity, message: str, metadata: dict[str, Any] | None = None) -> Finding:
    """A failing finding of ``severity``."""
    return Finding(passed=False, severity=severity, message=message, metadata=metadata or {})


def skipped(message: str, metadata: dict[str, Any] | None = None) -> Finding:
    """A check that could not be evaluated, and why."""
    return Finding(passed=False, skipped=True, message=message, metadata=metadata or {})


def check_group_consistency(state: PipelineState) -> Finding:
    """Group ids agree in the spec, the table and Kafka; no foreign consumer (blocking).

    The mirror merely lagging behind the table is a WARN: the next run repairs it. A group ahead
    of the table at a position the table left behind (a recorded rewind: an operator's reset or
    migration, or a rollback) is a WARN too: the next run moves it back (R48, R32). A group
    ahead with offsets nothing in the table explains is a foreign writer's: an ERROR naming it.
    A group retired by a migration is an ERROR naming the migration (R22).
    """
    spec = state.spec
    group = spec.consumer_group_id
    meta: dict[str, Any] = {"consumer_group_id": group}
    action = state.last_action
    if action is not None:
        meta["last_operator_action"] = describe_commit(action.snapshot_id, action.properties)
    if state.retirement is not None:
        successor = state.retirement.successor
        return failed(
            "ERROR",
            f"group {group!r} was retired by the {state.retirement.description}: its offsets in "
            f"table {spec.table} are stale and ingestion is blocked. Fix: set consumer_group_id: "
            f"{successor}; to really reuse {group!r}, reset its offsets explicitly first.",
            {**meta, "retired_by_snapshot": state.retirement.snapshot_id},
        )
    if state.committed is None and state.other_groups:
        others = sorted(state.other_groups)
        return failed(
            "ERROR",
            f"table {spec.table} holds offsets under group(s) {others} but none under "
            f"{group!r}: ingestion is blocked (it would re-read everything). Fix: set "
            f"consumer_group_id back to {others[0]!r}, or migrate the offsets to {group!r}.",
            {**meta, "groups_in_table": ", ".join(others)},
        )
    if state.group_members > 0 or state.group_state in ACTIVE_GROUP_STATES:
        return failed(
            "ERROR",
            f"Kafka group {group!r} has active members: someone else "
            "consumes with this pipeline's group id and may commit offsets under it. Give that "
            "consumer its own group id.",
            {**meta, "group_state": state.group_state},
        )
    committed = state.committed_offsets
    ahead = {k: o for k, o in state.group_offsets.items() if o > committed.get(k, o)}
    if ahead:
        where = sorted(ahead)[:5]
        source = explain_ahead(state.group_offsets, ahead, state.rewinds)
        if source is None:
            return failed(
                "ERROR",
                f"Kafka group {group!r} is ahead of the table at {where} with offsets no commit "
                f"or operator action of table {spec.table} explains: another writer (not this "
                "pipeline) commits offsets under this group id. Stop it, or give it its own "
                "group.",
                meta,
            )
        return failed(
            "WARN",
            f"Kafka group {group!r} is ahead of the table at {where} because {source.cause}: "
            "a recorded rewind, not a foreign writer. The mirror will be moved back to the "
            "table's offsets by the next run.",
            {**meta, "rewound_from_snapshot": source.snapshot_id},
        )
    behind = {k for k, o in committed.items() if state.group_offsets.get(k, -1) < o}
    if behind and state.dead_letters_owed:
        owed = state.dead_letters_owed
        if state.dead_letter_problem:
            cause = (
                f"because the dead-letter copy to topic {spec.dead_letter_topic!r} cannot be "
                f"made: {state.dead_letter_problem}"
            )
        else:
            cause = (
                f"waiting for the dead-letter copy to topic {spec.dead_letter_topic!r}: a run "
                "is copying, or its copy failed or was interrupted (its warning 'copying dead "
                f"letters of pipeline {spec.name!r} ... failed (...)' and its "
                "dead_letter_topic_copy metadata say why; a copy needs Write and Describe on "
                f"the transactional id 'kafka-iceberg-{spec.name}-dead-letters'), or the mirror "
                "failed after the copy; each run copies what is owed again before it mirrors"
            )
        return failed(
            "WARN",
            f"Kafka group {group!r} mirror is behind the table on {len(behind)} partition(s) "
            f"{cause}. The mirror moves only once every committed dead letter is copied.",
            {
                **meta,
                "dead_letter_commits_owed": len(owed),
                "dead_letters_owed": sum(p.records for p in owed),
            },
        )
    if behind:
        return failed(
            "WARN",
            f"Kafka group {group!r} mirror is behind the table on {len(behind)} "
            "partition(s); the next run repairs it.",
            meta,
        )
    return passed(f"group ids agree ({group!r}); no foreign members", meta)


def check_commit_freshness(state: PipelineState, now_ms: int | None = None) -> Finding:
    """Stale only while records wait longer than the bound (at ``now_ms``, by default when the
    state was read); an idle topic is fresh (R10).

    How long records wait is the lag in seconds of :func:`ingestion.health.lag.measure_lag_age`: a
    producer timestamp in the future is not trusted (the age is then bounded by the last
    commit), and the partition and offset that carry it are named in the message and in
    ``future_timestamps``. Without the records' timestamps, the last commit's age stands in.
    """
    now_ms = state.read_at_ms if now_ms is None else now_ms
    lag = sum(state.lag().values())
    last = state.commits[0].timestamp_ms if state.commits else None
    age_s = (now_ms - last) / 1000 if last is not None else None
    bound = state.spec.freshness_bound_seconds
    meta: dict[str, Any] = {"lag_records": lag, "freshness_bound_s": bound}
    if age_s is not None:
        meta["last_commit_age_s"] = round(age_s, 1)
    if state.missing_topics:
        return failed(
            "ERROR",
            f"topic(s) {state.missing_topics} of pipeline {state.spec.name!r} do not exist "
            "(deleted, or misspelt in the spec): nothing can be ingested from them. Create "
            "them, or fix the pipeline's topics.",
            {**meta, "missing_topics": ", ".join(state.missing_topics)},
        )
    if lag == 0:
        return passed("no uncommitted records: the table is current", meta)
    waited = measure_lag_age(state, now_ms)
    future = ""
    if waited.future:
        meta["future_timestamps"] = waited.describe_future()
        future = (
            f"; producer timestamps in the future at {waited.describe_future()} are not "
            "trusted (fix that producer's clock): their age is bounded by the last commit"
        )
    if waited.seconds is not None:  # lag in seconds: the age of the oldest uncommitted record
        lag_s = waited.seconds
        meta["lag_seconds"] = round(lag_s, 1)
        if lag_s > bound:
            return failed(
                "ERROR",
                f"{lag} records are waiting, the oldest for {lag_s:.0f} s (bound {bound} s)"
                f"{future}. Check that the lag sensor (or the pipeline's stream) is running and "
                "recent ingestion runs succeeded.",
                meta,
            )
    if waited.unknown:
        where = ", ".join(f"{t}[{p}]" for t, p in waited.unknown[:5])
        return failed(
            "WARN",
            f"{lag} records are waiting; at {where} the oldest carries a timestamp in the "
            f"future and pipeline {state.spec.name!r} never committed, so how long they have "
            f"waited is unknown{future}. Fix that producer's clock; the first commit bounds "
            "the age.",
            meta,
        )
    if waited.seconds is not None:
        return passed(f"{lag} records pending, the oldest {waited.seconds:.0f} s old{future}", meta)
    if age_s is not None and age_s <= bound:
        return passed(f"{lag} records pending, last commit {age_s:.0f} s ago", meta)
    when = "never" if age_s is None else f"{age_s:.0f} s ago"
    return failed(
        "ERROR",
        f"{lag} records are waiting and the last commit was {when} (bound {bound} s). Check "
        "that the lag sensor is running and recent ingestion runs succeeded.",
        meta,
    )


def check_retention_risk(state: PipelineState) -> Finding:
    """Committed offsets below the log start (data lost, R12) or within the margin of it."""
    committed, starts = state.committed_offsets, state.log_start_offsets
    margin = state.spec.retention_margin_records
    lost = {k: (o, starts[k]) for k, o in committed.items() if k in starts and o < starts[k]}
    if lost:
        examples = sorted(lost.items())[:5]
        return failed(
            "ERROR",
            f"records were deleted by retention before being ingested at {examples} "
            "(committed offset, log start). The next run fails; set on_data_loss: skip to "
            "accept the loss, and lengthen the topic's retention.",
            {"partitions_lost": len(lost)},
        )
    lag = state.lag()
    # A log that still starts at 0 has never lost a record to retention: no risk to report.
    close = sorted(
        k
        for k, o in committed.items()
        if starts.get(k, 0) > 0 and lag.get(k, 0) > 0 and o - starts[k] < margin
    )
    if close:
        return failed(
            "WARN",
            f"uncommitted records within {margin} offsets of deletion at {close[:5]}: ingest "
            "more often or lengthen retention.",
            {"partitions_at_risk": len(close)},
        )
    return passed("committed offsets are clear of the retention boundary")


def check_dead_letter_rate(state: PipelineState, window: int = 20) -> Finding:
    """Quarantined / read over the last ``window`` commits against the pipeline's bound."""
    recent = state.commits[:window]
    read = sum(c.records + c.quarantined for c in recent)
    dead = sum(c.quarantined for c in recent)
    ratio = dead / read if read else 0.0
    bound = state.spec.max_dead_letter_ratio
    meta = {"quarantined": dead, "read": read, "ratio": round(ratio, 6), "max_ratio": bound}
    if ratio > bound:
        return failed(
            "WARN",
            f"{dead} of {read} records ({ratio:.2%}) went to {state.spec.quarantine_table} "
            f"in the last {len(recent)} commits (bound {bound:.2%}): inspect the quarantine "
            "table.",
            meta,
        )
    return passed(f"dead-letter rate {ratio:.2%} within {bound:.2%}", meta)


def check_watermark_reachable(state: PipelineState) -> Finding:
    """The current snapshot's ancestry still carries this group's offsets (R31), or the
    position table property does, proven by its witness row (R56)."""
    committed = state.committed
    if committed is not None and committed.from_position:
        return passed(
            "the offsets watermark is reachable through the position table property: another "
            "tool expired every snapshot that carried it (R56)"
        )
    if committed is not None or not state.table_has_rows:
        return passed("the offsets watermark is reachable")
    return failed(
        "ERROR",
        f"table {state.spec.table} holds rows but no snapshot in its ancestry carries offsets "
        f"for {state.spec.consumer_group_id!r} (expired, or rolled back past them), and the "
        f"position table property cannot be proven to belong to this history (its witness "
        "row is gone: rolled back, or deleted). Ingestion is blocked; reset the offsets "
        "explicitly.",
    )


@dataclass(frozen=True)
class CheckDef:
    """A named check: what it means, and (for state checks) how to evaluate it."""

    name: str
    description: str
    evaluate: Callable[[PipelineState], Finding] | None = None
    blocking: bool = False


GROUP_CHECK = CheckDef(
    "group_id_consistency",
    "Group ids agree in the spec, the table and Kafka; no foreign consumers.",
    check_group_consistency,
    blocking=True,
)
STATE_CHECKS = (
    CheckDef(
        "commit_freshness",
        "Stale only while records wait longer than the bound (lag in seconds; a producer "
        "timestamp in the future is not trusted).",
        check_commit_freshness,
    ),
    CheckDef(
        "retention_risk",
        "Committed offsets are not below, nor close to, the log start offset.",
        check_retention_risk,
    ),
    CheckDef(
        "dead_letter_rate",
        "Quarantined / read over recent commits stays under the pipeline's bound.",
        check_dead_letter_rate,
    ),
    CheckDef(
        "offsets_watermark_reachable",
        "The current snapshot's ancestry still carries this group's offsets, or the position "
        "table property does, proven by its witness row.",
        check_watermark_reachable,
    ),
)
AUDIT_CHECK = CheckDef(
    "exactly_once_audit",
    "Each commit since the last evaluation added exactly the records Kafka holds in its "
    "ranges, once; nothing else wrote to the table (full audit on demand).",
)
ALL_CHECKS = (GROUP_CHECK, *STATE_CHECKS, AUDIT_CHECK)


def replica_check_def(replica: ReplicaSpec) -> CheckDef:
    """The readiness check of one replica: its name and what it means (evaluated by the
    disaster-recovery add-on, ``platform_assets.dr.checks``)."""
    return CheckDef(
        f"replica_{replica.name.replace('-', '_')}_ready",
        f"MirrorMaker 2 readiness of replica {replica.name!r}: a compacted one-partition "
        "checkpoints topic, the group committed on the source, a recent checkpoint for it, and "
        "a copy of every topic with the same partitions (the way back while failed over).",
    )


def not_evaluated(state: PipelineState) -> Finding:
    """What the other checks report while the blocking group check fails (skipped): read under
    a group id that holds no progress, their figures (lag, commits, audit range) would be false.
    ``blocked_by`` names the check that blocks them."""
    spec = state.spec
    return skipped(
        f"not evaluated: ingestion of {spec.name!r} is blocked by {GROUP_CHECK.name}, so the "
        f"offsets under {spec.consumer_group_id!r} say nothing about the pipeline. "
        f"Fix {GROUP_CHECK.name} first (its message says how).",
        {"blocked_by": GROUP_CHECK.name},
    )


def evaluate_state_checks(state: PipelineState) -> dict[str, Finding]:
    """Every check computed from one state read, the blocking group-id check first; while it
    blocks, the others are :func:`not_evaluated`."""
    group = check_group_consistency(state)
    findings = {GROUP_CHECK.name: group}
    for check in STATE_CHECKS:
        if check.evaluate is not None:
            findings[check.name] = not_evaluated(state) if group.blocks else check.evaluate(state)
    return findings
