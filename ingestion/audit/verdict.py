"""The exactly-once audit's verdict (``exactly_once_audit``), from what the audit found.

Pure, like every check of :mod:`ingestion.health.checks`: it takes the audit's result and what the
previous evaluation left (:class:`ingestion.audit.incremental.AuditMemory`) and returns a
:class:`ingestion.health.checks.Finding`. Re-evaluating it is free; the audit itself only reads.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ingestion.audit.incremental import BACKLOG_BOUND_SECONDS, MAX_RECOUNT_ATTEMPTS, AuditMemory
from ingestion.health.checks import Finding, Severity, failed, passed, skipped
from ingestion.table.offsets import encode_positions

if TYPE_CHECKING:
    from ingestion.audit.oracle import PipelineAudit


def check_exactly_once(
    table: str,
    audit: PipelineAudit | None,
    previous: AuditMemory | None = None,
    now_ms: int | None = None,
) -> Finding:
    """The oracle's verdict: every commit audited since the cursor added exactly what Kafka
    holds in its ranges, once, and nothing else wrote to the table; with a full audit, also
    no duplicate, regression, shared file or overrun anywhere.

    The metadata carries what the next evaluation needs (``audit_cursor``; the commit it
    could not recount and ``recount_attempts``, counted on from ``previous``) and the backlog:
    ``backlog_commits``, ``backlog_offsets``, ``oldest_unaudited_age_s`` (at ``now_ms``). A
    commit that could not be recounted is a WARN naming it (the audit waits before it and
    retries), an ERROR after :data:`MAX_RECOUNT_ATTEMPTS` evaluations in a row; a backlog
    older than :data:`BACKLOG_BOUND_SECONDS`, or larger than one evaluation's budget, is a WARN;
    a cursor whose snapshot was expired (commits after it never recounted) is an ERROR unless
    a full audit verified every row (R47).
    """
    if audit is None:
        return skipped(f"table {table} does not exist yet: nothing to audit")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    commits, full = audit.commits, audit.full
    metadata: dict[str, Any] = {
        "audit_cursor": "" if commits.cursor is None else str(commits.cursor),
        "audit_cursor_offsets": (
            "" if commits.cursor_offsets is None else encode_positions(commits.cursor_offsets)
        ),
        "commits_recounted": len(commits.recounted),
        "offsets_recounted": commits.offsets_recounted,
        "commits_pending": commits.pending,
        "backlog_commits": commits.pending,
        "backlog_offsets": commits.backlog_offsets,
        "mode": "full" if full else "incremental",
    }
    backlog_age_s = None
    if commits.oldest_unaudited_ms is not None:
        backlog_age_s = max(0.0, (now_ms - commits.oldest_unaudited_ms) / 1000)
        metadata["oldest_unaudited_age_s"] = round(backlog_age_s, 1)
    attempts = 0
    if commits.unrecounted_snapshot is not None:
        same = previous is not None and previous.unrecounted_snapshot == (
            commits.unrecounted_snapshot
        )
        attempts = (previous.attempts if same and previous else 0) + 1
        metadata["unrecounted_snapshot"] = str(commits.unrecounted_snapshot)
        metadata["recount_attempts"] = attempts
    if audit.budget is not None:
        metadata["recount_budget_offsets"] = audit.budget
    if commits.notes:
        metadata["not_verified"] = "; ".join(commits.notes[:5])
    problems = list(commits.findings)
    if full is not None:
        metadata |= {
            "rows": full.rows,
            "quarantined": full.quarantined,
            "duplicates": len(full.duplicates),
            "regressions": len(full.regressions),
            "duplicate_files": len(full.duplicate_files),
        }
        if not full.ok:
            problems.insert(0, full.summary())
    if problems:
        return failed(
            "ERROR",
            f"exactly-once violated: {'; '.join(problems[:5])}. Stop the pipeline's runs, keep "
            "the snapshots, and inspect the listed coordinates and snapshots.",
            metadata,
        )
    done = (
        f"{len(commits.recounted)} commit(s) recounted in Kafka ({commits.offsets_recounted} "
        "offsets): each added exactly the visible records of its ranges"
    )
    if commits.cursor_expired is not None and full is None:
        return failed(
            "ERROR",
            f"commits after snapshot {commits.cursor_expired} (the audit's cursor) were expired "
            "before the audit recounted them: they can no longer be recounted, and the audit "
            "goes on from the newest commits. The maintenance schedule keeps the commits after "
            "the cursor (for up to 24 h), so expiry ran without it (platform maintain from the "
            "CLI) or the audit was stuck for longer; a full audit (platform status "
            f"--full-audit) still finds duplicates and regressions in what is left ({done}).",
            metadata,
        )
    backlog = ""
    if commits.pending:
        age = f", the oldest {backlog_age_s:.0f} s old" if backlog_age_s is not None else ""
        backlog = (
            f"{commits.pending} commit(s) ({commits.backlog_offsets} offsets) not yet audited{age}"
        )
    if commits.unrecounted is not None:
        severity: Severity = "ERROR" if attempts >= MAX_RECOUNT_ATTEMPTS else "WARN"
        then = (
            "the audit cannot move past it"
            if severity == "ERROR"
            else f"it is retried by the next evaluation ({MAX_RECOUNT_ATTEMPTS - attempts} "
            "more before this fails)"
        )
        return failed(
            severity,
            f"not audited: {commits.unrecounted}, {attempts} evaluation(s) in a row; {then}. "
            f"The audit's cursor stays before it ({backlog}; {done}). Restore access to the "
            "Kafka cluster of that commit (or its partition); nothing was skipped.",
            metadata,
        )
    behind = backlog_age_s is not None and backlog_age_s > BACKLOG_BOUND_SECONDS
    over = audit.budget is not None and commits.backlog_offsets > audit.budget
    if commits.pending and (behind or over):
        return failed(
            "WARN",
            f"the audit is falling behind: {backlog} (bounds {BACKLOG_BOUND_SECONDS} s, "
            f"{audit.budget} offsets per evaluation); {done}. Raise the pipeline's "
            "audit_recount_offsets, or run a full audit (platform status --full-audit).",
            metadata,
        )
    scope = f"each (topic, partition, offset) once: {full.summary()}; " if full else ""
    pending = f"; {backlog}, left for the next evaluation" if commits.pending else ""
    return passed(f"{scope}{done}{pending}", metadata)
