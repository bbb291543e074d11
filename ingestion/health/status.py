"""A pipeline's status for operators: offsets, lag and its age, commits, and every check.

Pure assembly of what :func:`ingestion.health.state.read_state` read and what the checks of
:mod:`ingestion.health.checks` found (named as the Dagster asset checks are, so ``platform status``
and the Dagster UI never disagree on what a check means), with when each finding was evaluated
(:class:`Evaluated`): now, from the state read, or earlier, recorded elsewhere (the exactly-once
audit's last evaluation in the Dagster instance), and the caveats of a pass (what it did not
cover: the audit's backlog, what it could not recount). Every age is measured from one ``now``,
read by the caller after everything slow it did (an audit): assemble last, print at once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from ingestion.health.checks import Finding
from ingestion.health.lag import measure_lag_age
from ingestion.health.state import PipelineState
from ingestion.table.offsets import VALID_THROUGH_MS

SHOWN_COMMITS = 5  # the newest commits ``platform status`` lists


@dataclass(frozen=True)
class Evaluated:
    """When a check's finding was evaluated, and where: by this caller (``fresh``: the state it
    read, an audit it ran), or earlier, recorded elsewhere (``run_id``: the Dagster run of the
    last evaluation). ``at_ms`` None: never evaluated (the finding says why; it is skipped). A
    recorded finding older than ``stale_after_s`` is stale: it speaks of the table as it was
    then, and nothing has evaluated it since."""

    at_ms: int | None
    fresh: bool
    run_id: str = ""
    stale_after_s: float | None = None


@dataclass
class PartitionStatus:
    """One partition: the table's offset, Kafka's end, the Kafka group's mirror, the lag."""

    partition: str
    committed: int | None
    end: int
    mirrored: int | None
    lag: int
    oldest_uncommitted_age_s: float | None = None


@dataclass
class PipelineStatus:
    """What ``platform status`` shows for one pipeline (``--json`` prints it as it is)."""

    pipeline: str
    table: str
    group_id: str
    lag_records: int
    oldest_uncommitted_age_s: float | None
    last_commit_age_s: float | None
    valid_through: str | None
    future_timestamps: str | None = None  # untrusted producer timestamps (ingestion.health.lag)
    as_of_ms: int = 0  # the ``now`` every age is measured from
    partitions: list[PartitionStatus] = field(default_factory=list)
    # Check name -> passed, skipped, severity, message, caveats (of a pass) and when evaluated.
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The newest commits, newest first: when, records, quarantined, inserts, updates, deletes.
    commits: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failing(self) -> dict[str, str]:
        """Check name -> message, for the checks that fail (not those skipped)."""
        return {
            n: c["message"]
            for n, c in self.checks.items()
            if not c["passed"] and not c.get("skipped")
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            **asdict(self),
            "as_of": format_instant(self.as_of_ms),
            "failing_checks": self.failing,
        }


def format_instant(epoch_ms: int) -> str:
    """An instant in UTC, to the second, as ``platform status`` prints it.

    Example:
        >>> format_instant(1_795_845_603_250)
        '2026-11-28T06:00:03Z'
    """
    moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def build_status(
    state: PipelineState,
    findings: dict[str, Finding],
    now_ms: int | None = None,
    evaluated: Mapping[str, Evaluated] | None = None,
    caveats: Mapping[str, Sequence[str]] | None = None,
) -> PipelineStatus:
    """Assemble the status from the state (read with its oldest uncommitted timestamps) and
    the checks' findings. Ages of waiting records are :func:`ingestion.health.lag.measure_lag_age`'s
    (a future producer timestamp is bounded by the last commit, and named).

    Every age (the last commit's, the waiting records', each finding's) is measured from
    ``now_ms`` (default: the clock, read here): a caller that did something slow after reading
    the state (an audit) reads the state again after it, then assembles. ``evaluated`` says when
    the findings that were not evaluated from ``state`` were (default: each finding is fresh,
    evaluated when ``state`` was read). ``caveats`` names, by check, what a passing finding did
    not cover (each check's ``caveats``: empty for the others, and for any finding that does not
    pass): a pass with caveats is still a pass, and says them."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    evaluated, caveats = evaluated or {}, caveats or {}
    committed, lag = state.committed_offsets, state.lag()
    waited = measure_lag_age(state, now_ms)  # the lag sensor's and commit_freshness's figure
    last = state.commits[0] if state.commits else None
    valid_through = int(last.properties.get(VALID_THROUGH_MS, 0)) if last else 0

    def age(timestamp_ms: int | None) -> float | None:
        return None if timestamp_ms is None else round(max(0, now_ms - timestamp_ms) / 1000, 1)

    def rounded(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds, 1)

    partitions = [
        PartitionStatus(
            partition=f"{t}:{p}",
            committed=committed.get((t, p)),
            end=end,
            mirrored=state.group_offsets.get((t, p)),
            lag=lag.get((t, p), 0),
            oldest_uncommitted_age_s=rounded(waited.partitions.get((t, p))),
        )
        for (t, p), end in sorted(state.end_offsets.items())
    ]
    spec = state.spec
    return PipelineStatus(
        pipeline=spec.name,
        table=spec.table,
        group_id=spec.consumer_group_id,
        lag_records=sum(lag.values()),
        oldest_uncommitted_age_s=rounded(waited.seconds),
        future_timestamps=waited.describe_future() or None,
        last_commit_age_s=age(last.timestamp_ms) if last else None,
        valid_through=(
            datetime.fromtimestamp(valid_through / 1000, UTC).isoformat(timespec="seconds")
            if valid_through
            else None
        ),
        partitions=partitions,
        commits=[
            {
                "snapshot_id": c.snapshot_id,
                "committed_at": datetime.fromtimestamp(c.timestamp_ms / 1000, UTC).isoformat(
                    timespec="seconds"
                ),
                "records": c.records,
                "quarantined": c.quarantined,
                **c.changes,
            }
            for c in state.commits[:SHOWN_COMMITS]
        ],
        checks={
            name: {
                "passed": f.passed,
                "skipped": f.skipped,
                "severity": f.severity,
                "message": f.message,
                "caveats": list(caveats.get(name, ())) if f.passed else [],
                **describe_evaluation(
                    evaluated.get(name, Evaluated(state.read_at_ms, fresh=True)), now_ms
                ),
            }
            for name, f in findings.items()
        },
        as_of_ms=now_ms,
    )


def describe_evaluation(evaluated: Evaluated, now_ms: int) -> dict[str, Any]:
    """When a finding was evaluated, as ``--json`` shows it: ``evaluated_at`` (UTC, None if
    never) and ``evaluated_at_ms``, its ``age_s`` at ``now_ms``, whether ``fresh`` (evaluated by
    this caller), the ``run_id`` of a recorded one, and whether it is ``stale``.

    Example:
        >>> recorded = Evaluated(1_795_845_600_000, fresh=False, run_id="r1", stale_after_s=600)
        >>> describe_evaluation(recorded, 1_795_845_600_000 + 660_000)["stale"]
        True
    """
    at = evaluated.at_ms
    age_s = None if at is None else round(max(0, now_ms - at) / 1000, 1)
    bound = evaluated.stale_after_s
    return {
        "evaluated_at": None if at is None else format_instant(at),
        "evaluated_at_ms": at,
        "age_s": age_s,
        "fresh": evaluated.fresh,
        "run_id": evaluated.run_id or None,
        "stale": age_s is not None and bound is not None and age_s > bound,
        "stale_after_s": bound,
    }
