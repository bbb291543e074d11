"""A pipeline's state, read once without consuming: the table's offsets and Kafka's metadata.

The records here (:class:`PipelineState`, :class:`Commit`) are what the checks
(:mod:`ingestion.health.checks`), the lag sensor and ``platform status`` evaluate;
:func:`read_state`
is the only I/O. Reading commits nothing and joins no group: the oldest uncommitted record of
each lagging partition is read with ``assign()``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingestion import exceptions
from ingestion.kafka.consumer import open_consumer
from ingestion.kafka.ranges import Key
from ingestion.kafka.topics import (
    TopicState,
    describe_topic,
    list_pipeline_topics,
    read_first_timestamps_ms,
)
from ingestion.quarantine.dead_letters import (
    PendingCopy,
    create_topic_refusal,
    creation_refused,
    dead_letter_topic_partitions,
    unpublished_commits,
)
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import (
    OFFSETS_PREFIX,
    QUARANTINED,
    RECORDS,
    RESET_BY,
    CommittedState,
    decode_offsets,
    find_committed_state,
    find_groups,
    flatten,
    iter_ancestry,
    snapshot_properties,
    table_has_rows,
)
from ingestion.table.rewind import Retirement, RewindSource, find_retirement, find_rewinds

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient
    from pyiceberg.table import Table


@dataclass(frozen=True)
class Commit:
    """One commit of the group in the snapshot lineage (an ingestion run or operator action)."""

    snapshot_id: int
    timestamp_ms: int
    records: int
    quarantined: int
    offsets: dict[Key, int]
    properties: dict[str, str]

    @property
    def changes(self) -> dict[str, int]:
        """An upsert commit's inserts, updates and deletes (``mode: upsert``: its snapshot's
        ``kafka.cdc.*`` properties); an append commit's rows are all inserts."""
        from ingestion.table.upsert import read_counts

        counts = read_counts(self.properties)
        if counts is None:
            return {"inserts": self.records, "updates": 0, "deletes": 0}
        return {"inserts": counts.inserts, "updates": counts.updates, "deletes": counts.deletes}


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
    missing_topics: list[str] = field(default_factory=list)
    group_offsets: dict[Key, int] = field(default_factory=dict)
    group_state: str = "UNKNOWN"
    group_members: int = 0
    group_error: str | None = None
    oldest_uncommitted_ms: dict[Key, int] = field(default_factory=dict)
    read_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    # Positions the table left behind (rollback, operator action): read only when the Kafka
    # group is ahead of the table, to tell a recorded rewind from a foreign writer.
    rewinds: list[RewindSource] = field(default_factory=list)
    retirement: Retirement | None = None  # the migration that retired this group id
    # With a dead_letter_topic and the mirror behind: commits whose dead letters are not
    # copied yet (the mirror waits for their copy), and why a copy cannot be made, when the
    # cause can be read without changing anything (the topic is missing and cannot be created).
    dead_letters_owed: list[PendingCopy] = field(default_factory=list)
    dead_letter_problem: str | None = None

    @property
    def last_action(self) -> Commit | None:
        """The newest operator action (reset, migration) among the recent commits."""
        return next((c for c in self.commits if RESET_BY in c.properties), None)

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


NEWEST_COMMITS = 100  # the commits a state holds (:attr:`PipelineState.commits`)


def commits_of(table: Table, group_id: str, limit: int = NEWEST_COMMITS) -> list[Commit]:
    """The newest ``limit`` commits of ``group_id`` in the table's lineage, newest first."""
    key = OFFSETS_PREFIX + group_id
    found = []
    for snapshot in iter_ancestry(table):
        properties = snapshot_properties(snapshot)
        if key in properties:
            found.append(
                Commit(
                    snapshot_id=snapshot.snapshot_id,
                    timestamp_ms=snapshot.timestamp_ms,
                    records=int(properties.get(RECORDS, "0")),
                    quarantined=int(properties.get(QUARANTINED, "0")),
                    offsets=flatten(decode_offsets(properties[key])),
                    properties=properties,
                )
            )
            if len(found) >= limit:
                break
    return found


def read_state(
    spec: PipelineSpec,
    table: Table | None,
    admin: AdminClient,
    consumer: Consumer,
    kafka_config: dict[str, Any] | None = None,
) -> PipelineState:
    """Read the pipeline's state from the table and Kafka metadata; consumes nothing.

    A topic that does not exist is listed in ``missing_topics`` (the others are read as usual).
    With ``kafka_config``, the timestamp of the first uncommitted record of each lagging
    partition is read too (``assign()``, nothing committed).
    """
    from confluent_kafka import KafkaException

    from ingestion.pipeline.mirror import read_group_offsets

    group = spec.consumer_group_id
    state = PipelineState(spec, table_exists=table is not None)
    if table is not None:
        state.table_has_rows = table_has_rows(table)
        state.committed = find_committed_state(table, group)
        state.other_groups = find_groups(table) - {group}
        state.commits = commits_of(table, group)
        state.retirement = find_retirement(table, group)
    for name in list_pipeline_topics(admin, spec):
        try:
            state.topics.append(describe_topic(admin, consumer, name))
        except exceptions.TopicNotFoundError:
            state.missing_topics.append(name)
    try:
        state.group_offsets = read_group_offsets(admin, group)
        described = admin.describe_consumer_groups([group])
        description = described[group].result(10)
        state.group_state = description.state.name
        state.group_members = len(description.members or [])
    except KafkaException as exc:
        state.group_error = str(exc.args[0])
    committed = state.committed_offsets
    if table is not None and any(state.group_offsets.get(k, -1) > o for k, o in committed.items()):
        state.rewinds = find_rewinds(table, group)
    behind = any(state.group_offsets.get(k, -1) < o for k, o in committed.items())
    if table is not None and spec.dead_letter_topic and behind and state.group_error is None:
        state.dead_letters_owed = unpublished_commits(table, group, state.group_offsets)
        if state.dead_letters_owed:
            state.dead_letter_problem = diagnose_dead_letter_topic(admin, spec)
    if kafka_config is not None:
        with open_consumer(kafka_config, f"{spec.name}-status") as reader:
            state.oldest_uncommitted_ms = read_first_timestamps_ms(
                reader, state.uncommitted_ranges()
            )
    return state


def diagnose_dead_letter_topic(admin: AdminClient, spec: PipelineSpec) -> str | None:
    """Why the spec's dead-letter topic cannot receive copies, read without changing anything:
    it does not exist and the broker would refuse to create it (a validate-only CreateTopics),
    or it cannot be described; None when nothing is found wrong."""
    topic = spec.dead_letter_topic
    assert topic is not None
    try:
        if dead_letter_topic_partitions(admin, topic) is not None:
            return None
        refusal = create_topic_refusal(admin, spec, validate_only=True)
    except Exception as exc:
        return f"dead-letter topic {topic!r} could not be described ({exc})"
    if refusal is not None:
        return creation_refused(spec, refusal)
    return (
        f"dead-letter topic {topic!r} does not exist yet; the next run creates it (partitions "
        f"{spec.dead_letter_topic_partitions}, replication factor "
        f"{spec.dead_letter_topic_replication_factor})"
    )
