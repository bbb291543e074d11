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
    from ingestion.audit.coverage import RangeRecount
    from ingestion.audit.oracle import AuditResult, PipelineAudit
    from ingestion.audit.snapshots import CommitAudit


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

    A full audit's range recount (``audit.ranges``, ingestion.audit.coverage) adds its
    findings; a range it could not read is a WARN naming it; and a full audit that recounted
    no offset at all while the table holds rows, or while it names what it could not check,
    is a WARN ("not evaluated"), never a pass, as is one that cannot tell a loss from
    something else (``RangeRecount.doubts``). A pass while some range or topic was not
    recounted says "passed, partly", those ranges in the metadata's ``not_recounted``. The
    message counts the offsets and partitions recounted, the snapshots expired before the
    oldest one left (covered only by the range recount), and names what was not recounted.
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
    ranges = audit.ranges
    if ranges is not None:
        metadata |= _range_metadata(ranges)
        problems += ranges.findings
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
    if ranges is not None:
        unrecounted = _check_range_recount(ranges, commits, full, done, metadata)
        if unrecounted is not None:
            return unrecounted
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
    covered = f"; {describe_range_recount(ranges)}" if ranges is not None else ""
    partly = ""
    if ranges is not None and ranges.unchecked:
        partly = (
            f"passed, partly: {len(ranges.unchecked)} range(s) or topic(s) not recounted "
            "(not_recounted), the rest checked: "
        )
    return passed(f"{partly}{scope}{done}{pending}{covered}", metadata)


def _range_metadata(ranges: RangeRecount) -> dict[str, Any]:
    """The range recount's figures for the check's metadata."""
    metadata: dict[str, Any] = {
        "range_partitions_recounted": ranges.partitions,
        "range_offsets_recounted": ranges.offsets,
        "range_records_recounted": ranges.visible,
    }
    if ranges.expired_snapshots is not None:
        metadata["expired_snapshots"] = ranges.expired_snapshots
    if ranges.unchecked:
        metadata["not_recounted"] = _join(ranges.unchecked)
    return metadata


def _check_range_recount(
    ranges: RangeRecount,
    commits: CommitAudit,
    full: AuditResult | None,
    done: str,
    metadata: dict[str, Any],
) -> Finding | None:
    """A WARN when the range recount could not read a range, when it cannot tell a loss from
    something else (``doubts``: records that are lost or dead letters not synced yet, rows
    whose records log compaction may have removed), or when the full audit recounted nothing
    although there was something to recount (but for a pipeline with replicas, which recounts
    its commits one by one by design); None otherwise."""
    if ranges.unrecounted is not None:
        return failed(
            "WARN",
            f"not evaluated: the full audit {ranges.unrecounted}; nothing was skipped: run it "
            f"again once the Kafka cluster answers ({done}).",
            metadata,
        )
    if ranges.doubts:
        return failed(
            "WARN",
            f"not evaluated: the full audit cannot tell a loss from what it names: "
            f"{_join(ranges.doubts)}. Not a pass ({done}).",
            metadata,
        )
    held = full.rows + full.quarantined if full is not None else 0
    if ranges.by_commit_only:  # by design: the commits and the rows' scan are its checks
        return None
    if commits.offsets_recounted or ranges.offsets or not (held or ranges.unchecked):
        return None
    return failed(
        "WARN",
        f"not evaluated: the full audit recounted no offset in Kafka although the table holds "
        f"{held} row(s) (quarantined included), so it checked nothing against Kafka: "
        f"{_join(ranges.unchecked) or 'every committed range is empty'}. "
        "Not a pass: the rows can no longer be compared with Kafka's records.",
        metadata,
    )


def describe_range_recount(ranges: RangeRecount) -> str:
    """What the range recount covered, in words: offsets, partitions and records recounted,
    the expired snapshots it alone covers, what it excused (each range left out on purpose,
    with why) and what it could not check."""
    shown = ", ".join(f"{r.topic}[{r.partition}] [{r.start}, {r.end})" for r in ranges.ranges[:3])
    more = f" and {len(ranges.ranges) - 3} more" if len(ranges.ranges) > 3 else ""
    but = f" but the {ranges.left_out} not expected (below)" if ranges.left_out else ""
    held = (
        "every row among them"
        if ranges.rows_only
        else f"each held by the table or its quarantine table{but}, and no row where Kafka "
        "holds no record"
    )
    text = "range recount: no offset recounted"
    if ranges.partitions:
        text = (
            f"range recount: {ranges.offsets} offsets of {ranges.partitions} partition(s) "
            f"recounted in Kafka record by record ({shown}{more}): {ranges.visible} records "
            f"Kafka holds, {held}"
        )
    covered = (
        "their commits are covered only by the range recount"
        if ranges.partitions
        else "their commits are not audited (no range could be recounted)"
    )
    if ranges.expired_snapshots:
        text += (
            f"; {ranges.expired_snapshots} snapshot(s) older than snapshot "
            f"{ranges.oldest_snapshot} were expired: {covered}"
        )
    elif ranges.expired_snapshots is None:
        text += (
            f"; the snapshots older than snapshot {ranges.oldest_snapshot} were expired (how "
            f"many a format v1 table does not tell): {covered}"
        )
    if ranges.notes:
        text += f"; {_join(ranges.notes)}"
    if ranges.unchecked:
        text += f"; not recounted: {_join(ranges.unchecked)}"
    return text


def _join(texts: list[str], limit: int = 5) -> str:
    """At most ``limit`` of ``texts``, and how many more there are."""
    more = f" (and {len(texts) - limit} more)" if len(texts) > limit else ""
    return "; ".join(texts[:limit]) + more
