"""Health of a pipeline, read without consuming: the evaluations behind the asset checks.

Each ``check_*`` function is pure: it takes a :class:`PipelineState` (read once from the table
and from Kafka's metadata) and returns a :class:`Finding` whose message says what is wrong and
how to fix it. The Dagster layer only translates findings into check results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ingestion import exceptions
from ingestion.offsets import (
    DEAD_LETTERED,
    OFFSETS_PREFIX,
    RECORDS,
    CommittedState,
    decode_offsets,
    find_committed_state,
    find_groups,
    flatten,
    iter_ancestry,
    snapshot_properties,
    table_has_rows,
)
from ingestion.spec import PipelineSpec
from ingestion.topics import TopicState, describe_topic, list_pipeline_topics

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient
    from pyiceberg.table import Table

Key = tuple[str, int]
ACTIVE_GROUP_STATES = {"STABLE", "PREPARING_REBALANCE", "COMPLETING_REBALANCE"}


@dataclass(frozen=True)
class Finding:
    """The outcome of one check: passed or not, how bad, why, and figures for the UI."""

    passed: bool
    severity: Literal["ERROR", "WARN"]
    message: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Commit:
    """One ingestion commit of the group, from the snapshot lineage."""

    snapshot_id: int
    timestamp_ms: int
    records: int
    dead_lettered: int
    offsets: dict[Key, int]
    properties: dict[str, str]


@dataclass
class PipelineState:
    """What the checks need, read once: the table's offsets and Kafka's metadata."""

    spec: PipelineSpec
    table_exists: bool
    table_has_rows: bool = False
    committed: CommittedState | None = None
    other_groups: set[str] = field(default_factory=set)
    commits: list[Commit] = field(default_factory=list)
    topics: list[TopicState] = field(default_factory=list)
    group_offsets: dict[Key, int] = field(default_factory=dict)
    group_state: str = "UNKNOWN"
    group_members: int = 0
    group_error: str | None = None
    read_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def committed_offsets(self) -> dict[Key, int]:
        """(topic, partition) -> next offset committed in the table."""
        return flatten(self.committed.offsets) if self.committed else {}

    @property
    def end_offsets(self) -> dict[Key, int]:
        """(topic, partition) -> Kafka's end (last stable) offset now."""
        return {(t.topic, p.partition): p.end_offset for t in self.topics for p in t.partitions}

    @property
    def log_start_offsets(self) -> dict[Key, int]:
        """(topic, partition) -> first offset still in the log."""
        return {
            (t.topic, p.partition): p.log_start_offset for t in self.topics for p in t.partitions
        }

    def uncommitted_ranges(self) -> dict[Key, tuple[int, int]]:
        """``[first uncommitted offset, end)`` of each partition with lag (a partition without
        committed offsets starts at its log start)."""
        committed, starts = self.committed_offsets, self.log_start_offsets
        first = {k: committed.get(k, starts[k]) for k in self.end_offsets}
        return {k: (first[k], end) for k, end in self.end_offsets.items() if end > first[k]}

    def lag(self) -> dict[Key, int]:
        """Records (offsets) not yet committed, per partition."""
        ranges = self.uncommitted_ranges()
        return {
            k: (end - ranges[k][0] if k in ranges else 0) for k, end in self.end_offsets.items()
        }


def commits_of(table: Table, group_id: str, limit: int = 100) -> list[Commit]:
    """The newest ``limit`` commits of ``group_id`` in the table's lineage, newest first."""
    key = OFFSETS_PREFIX + group_id
    found = []
    for snapshot in iter_ancestry(table):
        properties = snapshot_properties(snapshot)
        if key in properties:
            found.append(
                Commit(
                    snapshot.snapshot_id,
                    snapshot.timestamp_ms,
                    int(properties.get(RECORDS, "0")),
                    int(properties.get(DEAD_LETTERED, "0")),
                    flatten(decode_offsets(properties[key])),
                    properties,
                )
            )
            if len(found) >= limit:
                break
    return found


def read_state(
    spec: PipelineSpec, table: Table | None, admin: AdminClient, consumer: Consumer
) -> PipelineState:
    """Read the pipeline's state from the table and Kafka metadata; consumes nothing."""
    from confluent_kafka import KafkaException

    group = spec.effective_commit_group_id
    state = PipelineState(spec, table_exists=table is not None)
    if table is not None:
        state.table_has_rows = table_has_rows(table)
        state.committed = find_committed_state(table, group)
        state.other_groups = find_groups(table) - {group}
        state.commits = commits_of(table, group)
    for name in list_pipeline_topics(admin, spec):
        try:
            state.topics.append(describe_topic(admin, consumer, name))
        except exceptions.TopicNotFoundError:
            continue
    from ingestion.mirror import read_group_offsets

    try:
        state.group_offsets = read_group_offsets(admin, spec.consumer_group_id)
        described = admin.describe_consumer_groups([spec.consumer_group_id])
        description = described[spec.consumer_group_id].result(10)
        state.group_state = description.state.name
        state.group_members = len(description.members or [])
    except KafkaException as exc:
        state.group_error = str(exc.args[0])
    return state


def check_group_consistency(state: PipelineState) -> Finding:
    """Group ids agree everywhere (ERROR), or the mirror merely lags (WARN)."""
    spec = state.spec
    consumer, commit = spec.consumer_group_id, spec.effective_commit_group_id
    meta: dict[str, Any] = {"consumer_group_id": consumer, "commit_group_id": commit}
    if consumer != commit:
        return Finding(
            False,
            "ERROR",
            f"consumer_group_id {consumer!r} differs from "
            f"commit_group_id {commit!r}: set both to the same id.",
            meta,
        )
    if state.committed is None and state.other_groups:
        others = sorted(state.other_groups)
        return Finding(
            False,
            "ERROR",
            (
                f"table {spec.table} holds offsets under group(s) {others} but none under "
                f"{commit!r}: ingestion is blocked (it would re-read everything). Fix: set "
                f"consumer_group_id back to {others[0]!r}, or migrate the offsets to {commit!r}."
            ),
            {**meta, "groups_in_table": ", ".join(others)},
        )
    if state.group_members > 0 or state.group_state in ACTIVE_GROUP_STATES:
        return Finding(
            False,
            "ERROR",
            (
                f"Kafka group {consumer!r} has active members ({state.group_state}): someone else "
                "consumes with this pipeline's group id and may commit offsets under it. Give that "
                "consumer its own group id."
            ),
            {**meta, "group_state": state.group_state},
        )
    committed = state.committed_offsets
    ahead = {k: o for k, o in state.group_offsets.items() if o > committed.get(k, o)}
    if ahead:
        return Finding(
            False,
            "ERROR",
            (
                f"Kafka group {consumer!r} is ahead of the table at {sorted(ahead)[:5]}: another "
                "writer commits offsets under this group id. Stop it, or give it its own group."
            ),
            meta,
        )
    behind = {k for k, o in committed.items() if state.group_offsets.get(k, -1) < o}
    if behind:
        return Finding(
            False,
            "WARN",
            (
                f"Kafka group {consumer!r} mirror is behind the table on {len(behind)} "
                "partition(s); the next run repairs it."
            ),
            meta,
        )
    return Finding(True, "ERROR", f"group ids agree ({consumer!r}); no foreign members", meta)


def check_commit_freshness(state: PipelineState, now_ms: int | None = None) -> Finding:
    """Stale only while there is lag and the last commit is older than the bound (at
    ``now_ms``, by default when the state was read)."""
    now_ms = state.read_at_ms if now_ms is None else now_ms
    lag = sum(state.lag().values())
    last = state.commits[0].timestamp_ms if state.commits else None
    age_s = (now_ms - last) / 1000 if last is not None else None
    bound = state.spec.freshness_bound_seconds
    meta: dict[str, Any] = {"lag_records": lag, "freshness_bound_s": bound}
    if age_s is not None:
        meta["last_commit_age_s"] = round(age_s, 1)
    if lag == 0:
        return Finding(True, "WARN", "no uncommitted records: the table is current", meta)
    if age_s is not None and age_s <= bound:
        return Finding(True, "WARN", f"{lag} records pending, last commit {age_s:.0f} s ago", meta)
    when = "never" if age_s is None else f"{age_s:.0f} s ago"
    return Finding(
        False,
        "ERROR",
        (
            f"{lag} records are waiting and the last commit was {when} (bound {bound} s). Check "
            "that the lag sensor is running and recent ingestion runs succeeded."
        ),
        meta,
    )


def check_retention_risk(state: PipelineState) -> Finding:
    """Committed offsets below the log start (data lost) or within the margin of it."""
    committed, starts = state.committed_offsets, state.log_start_offsets
    margin = state.spec.retention_margin_records
    lost = {k: (o, starts[k]) for k, o in committed.items() if k in starts and o < starts[k]}
    if lost:
        examples = sorted(lost.items())[:5]
        return Finding(
            False,
            "ERROR",
            (
                f"records were deleted by retention before being ingested at {examples} "
                "(committed offset, log start). The next run fails; set on_data_loss: skip to "
                "accept the loss, and lengthen the topic's retention."
            ),
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
        return Finding(
            False,
            "WARN",
            (
                f"uncommitted records within {margin} offsets of deletion at {close[:5]}: ingest "
                "more often or lengthen retention."
            ),
            {"partitions_at_risk": len(close)},
        )
    return Finding(True, "ERROR", "committed offsets are clear of the retention boundary", {})


def check_dead_letter_rate(state: PipelineState, window: int = 20) -> Finding:
    """Quarantined / read over the last ``window`` commits against the pipeline's bound."""
    recent = state.commits[:window]
    read = sum(c.records + c.dead_lettered for c in recent)
    dead = sum(c.dead_lettered for c in recent)
    ratio = dead / read if read else 0.0
    bound = state.spec.max_dead_letter_ratio
    meta = {"dead_lettered": dead, "read": read, "ratio": round(ratio, 6), "max_ratio": bound}
    if ratio > bound:
        quarantine = state.spec.effective_quarantine_table
        return Finding(
            False,
            "WARN",
            (
                f"{dead} of {read} records ({ratio:.2%}) went to {quarantine} in the last "
                f"{len(recent)} commits (bound {bound:.2%}): inspect the quarantine table."
            ),
            meta,
        )
    return Finding(True, "WARN", f"dead-letter rate {ratio:.2%} within {bound:.2%}", meta)


def check_watermark_reachable(state: PipelineState) -> Finding:
    """The current snapshot's ancestry still carries this group's offsets (R31)."""
    if state.committed is not None or not state.table_has_rows:
        return Finding(True, "ERROR", "the offsets watermark is reachable", {})
    return Finding(
        False,
        "ERROR",
        (
            f"table {state.spec.table} holds rows but no snapshot in its ancestry carries offsets "
            f"for {state.spec.effective_commit_group_id!r} (expired, or rolled back past them). "
            "Ingestion is blocked; reset the offsets explicitly."
        ),
        {},
    )
