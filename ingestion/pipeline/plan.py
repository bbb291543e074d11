"""Step 1, the plan (driver): which offset ranges this run ingests, split into tasks.

Offsets come from the table (never from the Kafka group); end offsets are Kafka's last stable
offsets, frozen at plan time. Every inconsistency between the two fails by name (rule 2).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ingestion import exceptions
from ingestion.kafka.ranges import Key, LostRange, OffsetRange, cap_ends, split_tasks
from ingestion.kafka.topics import TopicState, describe_topic, list_pipeline_topics
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import (
    CommittedState,
    OffsetMap,
    TopicOffsets,
    find_committed_state,
    find_groups,
    table_has_rows,
)
from ingestion.table.rewind import check_not_retired

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient
    from pyiceberg.table import Table


@dataclass(frozen=True)
class Plan:
    """Everything the executors and the coordinator need, fixed at plan time."""

    pipeline: str
    group_id: str
    table: str
    table_uuid: str
    base_snapshot_id: int | None
    committed: OffsetMap | None
    cluster_id: str
    topic_ids: dict[str, str]
    start: dict[Key, int]
    end: dict[Key, int]
    tasks: tuple[OffsetRange, ...]
    lost: tuple[LostRange, ...] = ()
    notes: tuple[str, ...] = ()
    commit_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    planned_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    capped: bool = False

    @property
    def is_empty(self) -> bool:
        """No offset to read: the run commits nothing."""
        return not self.tasks

    @property
    def planned_offsets(self) -> int:
        """Offsets covered by the tasks."""
        return sum(task.size for task in self.tasks)

    def next_offsets(self) -> OffsetMap:
        """The offsets the commit stores: planned ends, idle partitions unchanged."""
        result: dict[str, dict[int, int]] = {}
        for (topic, partition), offset in sorted(self.end.items()):
            result.setdefault(topic, {})[partition] = offset
        return {
            topic: TopicOffsets(self.topic_ids[topic], parts) for topic, parts in result.items()
        }


def _check_committed_partition(
    spec: PipelineSpec, state: TopicState, partition: int, committed: int, log_start: int, end: int
) -> int:
    """Return the start offset for a committed partition, failing on every impossible case."""
    where = f"pipeline {spec.name!r}, {state.topic}[{partition}]"
    if committed > end:
        raise exceptions.OffsetOutOfRangeError(
            f"{where}: committed offset {committed} is above the end offset {end}; the log was "
            "truncated or the topic recreated. Inspect the topic, then reset the pipeline's "
            "offsets explicitly (docs/operate.md, 'Resetting offsets')."
        )
    return committed if committed >= log_start else log_start


def plan_partitions(
    spec: PipelineSpec,
    committed: CommittedState | None,
    topics: list[TopicState],
    starting: Mapping[Key, int],
    table_has_rows: bool,
    other_groups: set[str],
) -> tuple[dict[Key, int], dict[Key, int], list[LostRange], list[str]]:
    """Decide start and end offsets per partition (a pure function: unit-testable).

    Args:
        spec: the pipeline.
        committed: the group's offsets from the table, or None.
        topics: the topics as they are now (ids, log start and last stable offsets).
        starting: the resolved starting position, used for partitions with no offsets.
        table_has_rows: whether the table already holds data.
        other_groups: groups other than ours with offsets in the table.

    Returns:
        (start, end, lost ranges, notes) keyed by (topic, partition).

    Raises:
        GroupMismatchError, MissingOffsetsError, TopicNotFoundError, TopicRecreatedError,
        PartitionVanishedError, OffsetOutOfRangeError, DataLossError: as named.
    """
    name, group = spec.name, spec.consumer_group_id
    if committed is None and other_groups:
        raise exceptions.GroupMismatchError(
            f"pipeline {name!r}: table {spec.table} holds offsets under group(s) "
            f"{sorted(other_groups)} but none under {group!r}. A renamed group would re-read "
            f"everything and duplicate it. Set consumer_group_id back to one of "
            f"{sorted(other_groups)}, or migrate the offsets to {group!r} explicitly."
        )
    if committed is None and table_has_rows:
        raise exceptions.MissingOffsetsError(
            f"pipeline {name!r}: table {spec.table} holds rows but no snapshot in its current "
            "ancestry carries offsets (expired snapshots, or data written by another tool), and "
            f"the table property kafka.position.{group} cannot be proven to belong to this "
            "history (R56: its witness row is gone). Refusing to restart from the starting "
            "position; reset the offsets explicitly."
        )
    current = {state.topic: state for state in topics}
    old = committed.offsets if committed else {}
    for topic, stored in old.items():
        if topic not in current:
            raise exceptions.TopicNotFoundError(
                f"pipeline {name!r}: topic {topic!r} holds committed offsets but no longer "
                "exists (deleted, or no longer matches the pattern). Restore it or reset offsets."
            )
        if stored.topic_id != current[topic].topic_id:
            raise exceptions.TopicRecreatedError(
                f"pipeline {name!r}: topic {topic!r} id is {current[topic].topic_id}, offsets "
                f"were committed for id {stored.topic_id}: the topic was deleted and recreated. "
                "Reset the pipeline's offsets explicitly once you know what the new topic holds."
            )
        missing = set(stored.next_offsets) - {p.partition for p in current[topic].partitions}
        if missing:
            raise exceptions.PartitionVanishedError(
                f"pipeline {name!r}: partitions {sorted(missing)} of {topic!r} hold committed "
                "offsets but no longer exist. Refusing to drop them silently."
            )
    start: dict[Key, int] = {}
    end: dict[Key, int] = {}
    lost: list[LostRange] = []
    notes: list[str] = []
    for state in topics:
        stored_parts = old[state.topic].next_offsets if state.topic in old else None
        for part in state.partitions:
            key = (state.topic, part.partition)
            end[key] = part.end_offset
            if stored_parts is not None and part.partition in stored_parts:
                offset = stored_parts[part.partition]
                begin = _check_committed_partition(
                    spec, state, part.partition, offset, part.log_start_offset, part.end_offset
                )
            elif stored_parts is not None:  # a partition added since the last commit (R18)
                offset = begin = part.log_start_offset
                if begin > 0:
                    notes.append(
                        f"{state.topic}[{part.partition}] is new and starts at {begin} > 0: "
                        f"offsets [0, {begin}) may have been deleted before the first read"
                    )
            else:
                offset = begin = max(
                    starting.get(key, part.log_start_offset), part.log_start_offset
                )
            if begin > offset:
                lost.append(LostRange(state.topic, part.partition, offset, begin))
            start[key] = begin
    if lost and spec.on_data_loss == "fail":
        described = ", ".join(f"{r.topic}[{r.partition}] [{r.start}, {r.end})" for r in lost)
        raise exceptions.DataLossError(
            f"pipeline {name!r}: offsets {described} were deleted by retention before they were "
            "read. Nothing was committed. To skip them and record the loss in the snapshot, set "
            "on_data_loss: skip for this pipeline."
        )
    return start, end, lost, notes


def resolve_starting_offsets(
    spec: PipelineSpec, consumer: Consumer, topics: list[TopicState], timeout_s: float = 10.0
) -> dict[Key, int]:
    """Resolve the spec's starting position to offsets (used only for partitions with none)."""
    from confluent_kafka import TopicPartition

    position = spec.starting_position
    result: dict[Key, int] = {}
    for state in topics:
        for part in state.partitions:
            key = (state.topic, part.partition)
            if position.mode == "latest":
                result[key] = part.end_offset
            elif position.mode == "offsets":
                explicit = (position.offsets or {}).get(f"{state.topic}:{part.partition}")
                result[key] = part.log_start_offset if explicit is None else explicit
            else:
                result[key] = part.log_start_offset
    if position.timestamp_ms is not None:  # mode "timestamp"
        query = [TopicPartition(t, p, position.timestamp_ms) for t, p in result]
        for found in consumer.offsets_for_times(query, timeout=timeout_s):
            key = (found.topic, found.partition)
            # -1: no record at or after the timestamp, so start at the end.
            result[key] = found.offset if found.offset >= 0 else _end_of(topics, key)
    for key, offset in result.items():
        if offset > _end_of(topics, key):
            raise exceptions.PipelineSpecError(
                f"pipeline {spec.name!r}: starting_position gives {key[0]}[{key[1]}] offset "
                f"{offset}, above its end offset {_end_of(topics, key)}"
            )
    return result


def _end_of(topics: list[TopicState], key: Key) -> int:
    return next(s.end_offsets[key[1]] for s in topics if s.topic == key[0])


def build_plan(
    spec: PipelineSpec,
    table: Table,
    admin: AdminClient,
    consumer: Consumer,
    cluster_id: str,
) -> Plan:
    """Plan one run against the table's committed offsets and Kafka's last stable offsets.

    The consumer must be configured with ``isolation.level=read_committed`` (the engine's
    default), so end offsets never pass an open transaction. Delivery: planning reads only;
    running it twice gives the same start offsets until a commit lands.
    """
    group = spec.consumer_group_id
    committed = find_committed_state(table, group)
    check_not_retired(spec, table)
    if committed and committed.cluster_id and committed.cluster_id != cluster_id:
        raise exceptions.ClusterChangedError(
            f"pipeline {spec.name!r}: offsets were committed against Kafka cluster "
            f"{committed.cluster_id!r}, the configured cluster is {cluster_id!r}. Point the "
            "Kafka resource at the original cluster, or reset the offsets explicitly."
        )
    names = set(list_pipeline_topics(admin, spec))
    if spec.topic_pattern and committed:
        names |= set(committed.offsets)  # a committed topic no longer matching fails below
    topics = []
    for name in sorted(names):
        try:
            topics.append(describe_topic(admin, consumer, name))
        except exceptions.TopicNotFoundError as exc:
            raise exceptions.TopicNotFoundError(f"pipeline {spec.name!r}: {exc}") from exc
    starting = resolve_starting_offsets(spec, consumer, topics) if committed is None else {}
    other_groups = find_groups(table) - {group} if committed is None else set()
    start, end, lost, notes = plan_partitions(
        spec, committed, topics, starting, table_has_rows(table), other_groups
    )
    capped_end = cap_ends(start, end, spec.max_records_per_run)
    capped, end = capped_end != end, capped_end
    snapshot = table.current_snapshot()
    return Plan(
        pipeline=spec.name,
        group_id=group,
        table=spec.table,
        table_uuid=str(table.metadata.table_uuid),
        base_snapshot_id=snapshot.snapshot_id if snapshot else None,
        committed=committed.offsets if committed else None,
        cluster_id=cluster_id,
        topic_ids={s.topic: s.topic_id for s in topics},
        start=start,
        end=end,
        tasks=tuple(split_tasks(start, end, spec.max_records_per_task)),
        lost=tuple(lost),
        notes=tuple(notes),
        capped=capped,
    )
