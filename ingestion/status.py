"""A pipeline's status for operators: offsets, lag and its age, commits, and every check.

The checks are the pure ``check_*`` functions of :mod:`ingestion.health`, named as the Dagster
asset checks are, so ``platform status`` and the Dagster UI never disagree on what a check
means. Reading the status commits nothing: the oldest-uncommitted age comes from reading one
record per lagging partition with ``assign()`` (no group joined, no offset committed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from ingestion.health import (
    Finding,
    PipelineState,
    check_commit_freshness,
    check_dead_letter_rate,
    check_group_consistency,
    check_retention_risk,
    check_watermark_reachable,
)
from ingestion.offsets import VALID_THROUGH_MS
from ingestion.read import reader_config
from ingestion.topics import read_first_timestamps_ms

Key = tuple[str, int]
GROUP_CHECK = "group_id_consistency"
# Name -> (description, evaluation): the checks computed from one read of a PipelineState.
STATE_CHECKS: dict[str, tuple[str, Callable[[PipelineState], Finding]]] = {
    "commit_freshness": (
        "Stale only while records wait and the last commit is older than the bound.",
        check_commit_freshness,
    ),
    "retention_risk": (
        "Committed offsets are not below, nor close to, the log start offset.",
        check_retention_risk,
    ),
    "dead_letter_rate": (
        "Quarantined / read over recent commits stays under the pipeline's bound.",
        check_dead_letter_rate,
    ),
    "offsets_watermark_reachable": (
        "The current snapshot's ancestry still carries this group's offsets.",
        check_watermark_reachable,
    ),
}


def evaluate_checks(state: PipelineState) -> dict[str, Finding]:
    """Every state check, the blocking group-id consistency check first."""
    findings = {GROUP_CHECK: check_group_consistency(state)}
    findings.update({name: evaluate(state) for name, (_, evaluate) in STATE_CHECKS.items()})
    return findings


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
    partitions: list[PartitionStatus] = field(default_factory=list)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def failing(self) -> dict[str, str]:
        """Check name -> message, for the checks that do not pass."""
        return {n: c["message"] for n, c in self.checks.items() if not c["passed"]}

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {**asdict(self), "failing_checks": self.failing}


def build_status(
    state: PipelineState,
    oldest_ms: dict[Key, int],
    findings: dict[str, Finding],
    now_ms: int | None = None,
) -> PipelineStatus:
    """Assemble the status from the state, the oldest uncommitted timestamps and the checks."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    committed, lag = state.committed_offsets, state.lag()
    last = state.commits[0] if state.commits else None
    valid_through = int(last.properties.get(VALID_THROUGH_MS, 0)) if last else 0

    def age(timestamp_ms: int | None) -> float | None:
        return None if timestamp_ms is None else round(max(0, now_ms - timestamp_ms) / 1000, 1)

    partitions = [
        PartitionStatus(
            f"{t}:{p}",
            committed.get((t, p)),
            end,
            state.group_offsets.get((t, p)),
            lag.get((t, p), 0),
            age(oldest_ms.get((t, p))),
        )
        for (t, p), end in sorted(state.end_offsets.items())
    ]
    spec = state.spec
    return PipelineStatus(
        pipeline=spec.name,
        table=spec.table,
        group_id=spec.effective_commit_group_id,
        lag_records=sum(lag.values()),
        oldest_uncommitted_age_s=age(min(oldest_ms.values())) if oldest_ms else None,
        last_commit_age_s=age(last.timestamp_ms) if last else None,
        valid_through=(
            datetime.fromtimestamp(valid_through / 1000, UTC).isoformat(timespec="seconds")
            if valid_through
            else None
        ),
        partitions=partitions,
        checks={
            name: {"passed": f.passed, "severity": f.severity, "message": f.message}
            for name, f in findings.items()
        },
    )


def read_status(
    state: PipelineState, kafka_config: dict[str, Any], extra: dict[str, Finding] | None = None
) -> PipelineStatus:
    """The status of ``state``'s pipeline: reads one record per lagging partition, commits
    nothing. ``extra`` adds findings computed elsewhere (the exactly-once audit)."""
    from confluent_kafka import Consumer

    consumer = Consumer(reader_config(kafka_config, state.spec.name))
    try:
        oldest = read_first_timestamps_ms(consumer, state.uncommitted_ranges())
    finally:
        consumer.close()
    return build_status(state, oldest, {**evaluate_checks(state), **(extra or {})})
