"""Step 4, publish (driver, best effort): mirror the table's offsets into the Kafka group.

The group is an informational mirror so standard Kafka tooling shows progress and lag; it is never
read to plan (rule 5). It stores the planned end offsets (so a quiet transactional topic shows lag
0, R26). It moves forward on ordinary commits and never backwards over offsets the table cannot
explain (R8); after a recorded rewind (an operator's reset or migration, R48, or a rollback, R32)
it is moved back to exactly the table's offsets (the rule and why a zombie cannot abuse it:
:mod:`ingestion.table.rewind`). A failure here never fails the ingestion: the table is the source of
truth and the next run repairs the mirror.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ingestion.kafka.ranges import Key
from ingestion.table.offsets import find_committed_state, flatten
from ingestion.table.rewind import RewindSource, find_rewinds, plan_mirror

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient
    from pyiceberg.table import Table


@dataclass(frozen=True)
class MirrorOutcome:
    """What the mirror did: partitions moved forward, moved back (and why), left ahead, and why
    it failed if it did."""

    group_id: str
    advanced: dict[Key, int] = field(default_factory=dict)
    foreign_members: bool = False
    error: str | None = None
    rewound: dict[Key, int] = field(default_factory=dict)
    rewound_because: str | None = None
    left_ahead: dict[Key, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the group now holds offsets at or past the committed ones."""
        return self.error is None

    def describe(self) -> str:
        """One line for an operator: where the group is now, relative to the table."""
        group = f"Kafka group {self.group_id!r}"
        if self.error is not None:
            return f"{group} was not moved ({self.error}); the next run moves it"
        if self.left_ahead:
            return (
                f"{group} is ahead of the table at {sorted(self.left_ahead)[:5]} with offsets "
                "no commit of the table explains (another writer?): left as is"
            )
        if self.rewound:
            return (
                f"{group} moved back to the table's offsets on {len(self.rewound)} partition(s) "
                f"({self.rewound_because})"
            )
        return f"{group} now holds the table's offsets"


# Errors that mean "the group's coordinator is moving or loading": retried.
_COORDINATOR_NOT_READY = frozenset(
    {"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"}
)


def wait_for_group_coordinator(admin: AdminClient, group_id: str, timeout_s: float) -> None:
    """Return once the broker coordinating ``group_id`` answers for it; raise KafkaException if
    it does not within ``timeout_s``.

    librdkafka 2.16's admin ListConsumerGroupOffsets crashes the process (SIGSEGV, a NULL
    consumer-group handle in ``rd_kafka_handle_OffsetFetch``;
    https://github.com/confluentinc/librdkafka/issues/5040) when the broker answers
    NOT_COORDINATOR, which Kafka does while a coordinator loads (a broker that just started, a
    partition of ``__consumer_offsets`` that just moved). DescribeConsumerGroups reports the
    same state as an error instead, so it is asked first, until the coordinator is ready. A
    coordinator that moves between the two calls can still crash the process; a librdkafka
    release with the fix closes that window.
    """
    from confluent_kafka import KafkaError, KafkaException

    deadline = time.monotonic() + timeout_s
    while True:
        (future,) = admin.describe_consumer_groups([group_id]).values()
        try:
            future.result(max(deadline - time.monotonic(), 0.1))
            return
        except TimeoutError as exc:
            raise _timed_out(f"the coordinator of group {group_id!r}", timeout_s) from exc
        except KafkaException as exc:
            error = exc.args[0]
            name = error.name() if isinstance(error, KafkaError) else ""
            if name == "GROUP_ID_NOT_FOUND":  # the coordinator answered: no such group
                return
            if name not in _COORDINATOR_NOT_READY or time.monotonic() >= deadline:
                raise
        time.sleep(0.2)


def _timed_out(what: str, timeout_s: float) -> Exception:
    """A KafkaException for a call that did not answer in time (callers catch that type)."""
    from confluent_kafka import KafkaError, KafkaException

    return KafkaException(
        KafkaError(KafkaError._TIMED_OUT, f"{what} did not answer within {timeout_s:g} s")
    )


def read_group_offsets(
    admin: AdminClient, group_id: str, timeout_s: float = 10.0
) -> dict[tuple[str, int], int]:
    """Return the group's committed offsets (empty when the group does not exist)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    deadline = time.monotonic() + timeout_s
    wait_for_group_coordinator(admin, group_id, timeout_s)
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)])
    try:
        result = future[group_id].result(max(deadline - time.monotonic(), 1.0))
    except TimeoutError as exc:
        raise _timed_out(f"the offsets of group {group_id!r}", timeout_s) from exc
    return {
        (tp.topic, tp.partition): tp.offset
        for tp in result.topic_partitions or []
        if tp.offset >= 0 and tp.error is None
    }


def mirror_offsets(
    admin: AdminClient,
    group_id: str,
    offsets: dict[tuple[str, int], int],
    timeout_s: float = 10.0,
    *,
    rewinds: Callable[[], Sequence[RewindSource]] | None = None,
) -> MirrorOutcome:
    """Commit ``offsets`` (the table's) to ``group_id`` where the group is behind them, and where
    it is ahead at a position ``rewinds`` (read only then) says the table left behind.

    Kafka rejects a commit from a non-member while the group has active members
    (UNKNOWN_MEMBER_ID): that is reported as ``foreign_members``, not raised (R23). Every Kafka
    failure, a broker that stops answering mid-call included, is returned in ``error``, not
    raised: the table has committed, and the next run (or the operator's action) moves the group.
    """
    from confluent_kafka import (
        ConsumerGroupTopicPartitions,
        KafkaError,
        KafkaException,
        TopicPartition,
    )

    try:
        current = read_group_offsets(admin, group_id, timeout_s)
        ahead = any(current.get(k, -1) > o for k, o in offsets.items())
        plan = plan_mirror(offsets, current, rewinds() if ahead and rewinds else ())
        if plan.moves:
            request = ConsumerGroupTopicPartitions(
                group_id, [TopicPartition(t, p, o) for (t, p), o in sorted(plan.moves.items())]
            )
            future = admin.alter_consumer_group_offsets([request])[group_id]
            try:
                result = future.result(timeout_s)
            except TimeoutError as exc:  # a broker that hangs mid-call: an error, not a crash
                raise _timed_out(f"the offset commit of group {group_id!r}", timeout_s) from exc
            failed = [tp for tp in result.topic_partitions or [] if tp.error is not None]
            if failed:
                raise KafkaException(failed[0].error)
    except KafkaException as exc:
        error = exc.args[0]
        foreign = isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_MEMBER_ID
        message = (
            f"group {group_id!r} has active members that are not this pipeline (someone else "
            "consumes with this group id); the mirror commit was rejected"
            if foreign
            else f"mirroring offsets to group {group_id!r} failed: {error}"
        )
        return MirrorOutcome(group_id, foreign_members=foreign, error=message)
    because = plan.because.cause if plan.because else None
    return MirrorOutcome(
        group_id,
        advanced=plan.forward,
        rewound=plan.back,
        rewound_because=because,
        left_ahead=plan.left_ahead,
    )


def mirror_table_offsets(
    admin: AdminClient, table: Table, group_id: str, timeout_s: float = 10.0
) -> MirrorOutcome:
    """Mirror the group's offsets as the table holds them now (never a plan's: a zombie can only
    set the group to where the table is) into the Kafka group; see :func:`mirror_offsets`."""
    committed = find_committed_state(table, group_id)
    if committed is None:
        return MirrorOutcome(group_id)
    return mirror_offsets(
        admin,
        group_id,
        flatten(committed.offsets),
        timeout_s,
        rewinds=lambda: find_rewinds(table, group_id),
    )
