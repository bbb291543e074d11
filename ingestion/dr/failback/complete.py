"""Complete a failback: end the moved route once the reverse copies are drained (R49).

After ``platform failover P --to primary`` the route reads the origin topics *and* the reverse
copies (``dr.orders`` on the primary, ``ingestion.dr.failback.origin``), and every run commit
carries it (``kafka.route``). Once MM2's reverse flow is stopped and the table has read every
reverse-copy partition to its end, dropping them loses nothing: the completion is one
operator action, committed like the switch (compare-and-set on the offsets it was planned
from, :func:`~ingestion.ops.action.commit_action`), whose group offsets are the pipeline's own
topics at the table's current positions, under the primary's cluster id, marked
``kafka.route-ended`` (the reverse-copy partitions dropped and the offset each was read to; the
same in the table property ``kafka.dropped-offsets.<group>``, which outlives expiry: the full
audit's watermark for their rows).
From it on the route is gone (``ingestion.dr.route``): runs read the spec's topics, commits
carry no route, expiry keeps nothing for it, reset, migration and a new failover are allowed.

Refused, nothing changed (:class:`~ingestion.exceptions.FailoverRefusedError`, naming the
topic[partition] and what to do): no route, a route to a replica (a failover has no
completion, only a failback), a spec topic without offsets in the table, a reverse-copy
partition the table has not read to its end on the primary (read now, with open transactions
counted: MM2 still writing), a reverse copy missing or recreated, or an end that moves between
the plan and the commit (MM2's reverse flow still runs).

Delivery: the completion reads nothing and writes no rows; a run that planned on the old route
loses its compare-and-set (the offsets moved) or, planning after it, is refused before it reads
(``refuse_ended_topics``). A stream committing meanwhile moves the offsets: the completion then
plans again from the new head (at most :data:`MAX_PLANS` times). Records MM2's reverse flow
copies after the commit are never read: stop it first.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingestion import exceptions
from ingestion.exceptions import FailoverRefusedError
from ingestion.kafka.ranges import Key
from ingestion.kafka.topics import TopicEnds
from ingestion.ops.action import ActionCommit, commit_action, refuse_active_runs
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table import offsets as props
from ingestion.table.offsets import (
    OffsetMap,
    decode_positions,
    encode_positions,
    find_committed_state,
)
from ingestion.table.route import DROPPED_PREFIX, PRIMARY, ROUTE_ENDED, active_switch

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

MAX_PLANS = 5  # plans in a row a completion may lose to other commits (a stream) before giving up


@dataclass(frozen=True)
class Completion:
    """A planned completion: the offsets it was planned from, the ones it commits (the spec's
    topics), and the reverse-copy partitions it drops with the offset each was read to."""

    planned_from: OffsetMap
    kept: OffsetMap
    dropped: dict[Key, int]
    cluster_id: str

    def describe(self, pipeline: str) -> list[str]:
        """One line per kept topic and per dropped partition."""
        return [
            f"completion of the failback of {pipeline!r}: the route ends; it reads "
            f"{sorted(self.kept)} on the primary",
            *(
                f"reverse copy {t}[{p}] read to its end ({o}): dropped"
                for (t, p), o in sorted(self.dropped.items())
            ),
        ]


def check_drained(
    pipeline: str, committed: OffsetMap, copies: list[str], found: dict[str, TopicEnds | None]
) -> dict[Key, int]:
    """Every partition of the ``copies`` on the primary (``found``, None: missing) is read to
    its end by ``committed``; return each one's offset, or refuse naming the first that is not.

    Example:
        >>> from ingestion.table.offsets import TopicOffsets
        >>> done = {"dr.o": TopicOffsets("i", {0: 5, 1: 3})}
        >>> check_drained("p", done, ["dr.o"], {"dr.o": TopicEnds("i", {0: (0, 5), 1: (3, 3)})})
        {('dr.o', 0): 5, ('dr.o', 1): 3}
        >>> late = {"dr.o": TopicEnds("i", {0: (0, 7), 1: (0, 3)})}
        >>> check_drained("p", done, ["dr.o"], late)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ingestion.exceptions.FailoverRefusedError: pipeline 'p': reverse copy dr.o[0] holds 2 ...
    """
    drained: dict[Key, int] = {}
    for topic in copies:
        ends, stored = found.get(topic), committed.get(topic)
        if ends is None or stored is None or stored.topic_id != ends.topic_id:
            what = "no longer exists" if ends is None else "was deleted and recreated"
            raise FailoverRefusedError(
                f"pipeline {pipeline!r}: reverse copy {topic!r} on the primary {what}, so it "
                "cannot be shown that the table read all of it; nothing was changed. Find out "
                "what happened to it before completing the failback"
            )
        gone = sorted(set(stored.next_offsets) - set(ends.ends))
        if gone:
            raise FailoverRefusedError(
                f"pipeline {pipeline!r}: reverse copy {topic}{gone} no longer exists on the "
                "primary; nothing was changed"
            )
        for partition, (low, high) in sorted(ends.ends.items()):
            at = stored.next_offsets.get(partition, low)
            if at < high:
                raise FailoverRefusedError(
                    f"pipeline {pipeline!r}: reverse copy {topic}[{partition}] holds "
                    f"{high - at} record(s) the table has not read (table at {at}, end {high} "
                    "on the primary). Stop MM2's reverse flow (records it copies after the "
                    "completion would never be read), let the pipeline ingest them, then "
                    "complete again; nothing was changed"
                )
            if at > high:
                raise FailoverRefusedError(
                    f"pipeline {pipeline!r}: reverse copy {topic}[{partition}] ends at {high} "
                    f"on the primary, below the table's {at} (truncated?); nothing was changed"
                )
            drained[(topic, partition)] = at
    return drained


def plan_completion(
    table: Table,
    spec: PipelineSpec,
    cluster_id: str,
    read_ends: Callable[[list[str]], dict[str, TopicEnds | None]],
) -> Completion:
    """Plan the completion of ``spec``'s failback from ``table`` now (``read_ends`` reads the
    primary, ``cluster_id`` is its id). Reads only."""
    name, group = spec.name, spec.consumer_group_id
    route = active_switch(table, group)
    if route is None:
        raise FailoverRefusedError(
            f"pipeline {name!r} reads its own topics on the primary (no failover or failback in "
            "force): there is no failback to complete; nothing was changed"
        )
    if route[props.FAILOVER_TO] != PRIMARY:
        raise FailoverRefusedError(
            f"pipeline {name!r} reads replica {route[props.FAILOVER_TO]!r} since a failover, "
            f"which has no completion: fail back first (platform failover {name} --to "
            "primary), then complete the failback; nothing was changed"
        )
    committed = find_committed_state(table, group)
    assert committed is not None  # active_switch found a route under its cluster id
    if committed.cluster_id != cluster_id:
        raise FailoverRefusedError(
            f"pipeline {name!r}: the table's offsets were committed against Kafka cluster "
            f"{committed.cluster_id!r}, the primary is {cluster_id!r}: check kafka."
            "bootstrap_servers in the configuration; nothing was changed"
        )
    missing = [topic for topic in spec.source_topics if topic not in committed.offsets]
    if missing:
        raise FailoverRefusedError(
            f"pipeline {name!r}: topics {missing} have no offsets in the table, so after the "
            "completion they would be read from their start again; nothing was changed"
        )
    copies = sorted(set(committed.offsets) - set(spec.source_topics))  # dropped: each drained
    drained = check_drained(name, committed.offsets, copies, read_ends(copies))
    kept = {topic: committed.offsets[topic] for topic in spec.source_topics}
    return Completion(committed.offsets, kept, drained, cluster_id)


def apply_completion(
    catalog: Catalog,
    spec: PipelineSpec,
    cluster_id: str,
    read_ends: Callable[[list[str]], dict[str, TopicEnds | None]],
    requested_by: str,
    reason: str,
    active_runs: int = 0,
    copy_owed: Callable[[], object] = lambda: None,
) -> tuple[Completion, int]:
    """Plan and commit the completion; return it and its snapshot id.

    Delivery: each attempt plans from the table's head, calls ``copy_owed`` (the dead letters
    of the commits the group has not passed: after the completion no copy searches them, and a
    run that won the race may have left its own copy failed; it raises to refuse, or
    :class:`CommitConflictError` to plan again: a run's copier fenced it), reads the
    reverse copies' ends again just before the commit (refused when they moved) and commits by
    compare-and-set on the offsets it planned from, so every commit it passes was copied;
    losing to a run or a stream re-plans, at most :data:`MAX_PLANS` times. A refused or failed
    completion changed nothing: plan it again.

    Raises:
        FailoverRefusedError: a precondition does not hold (nothing changed).
        CommitConflictError: a run is active, or other commits kept winning.
    """
    refuse_active_runs(spec, active_runs, "completing the failback")
    for _ in range(MAX_PLANS):
        table = catalog.load_table(spec.table)
        plan = plan_completion(table, spec, cluster_id, read_ends)
        try:
            copy_owed()  # after the plan's read: it covers every commit the plan stands on
        except exceptions.CommitConflictError:
            continue  # a run's copier fenced this copy: plan again
        copies = sorted({topic for topic, _ in plan.dropped})
        # Read again just before the commit: MM2's reverse flow still running is refused here.
        check_drained(spec.name, plan.planned_from, copies, read_ends(copies))
        try:
            return plan, commit_completion(catalog, spec, table, plan, requested_by, reason)
        except exceptions.CommitConflictError:
            continue  # a run or a stream committed since the plan: plan again from its offsets
    raise exceptions.CommitConflictError(
        f"pipeline {spec.name!r}: other commits moved the offsets {MAX_PLANS} times while the "
        "failback was being completed; nothing was committed. Try again"
    )


def commit_completion(
    catalog: Catalog,
    spec: PipelineSpec,
    table: Table,
    plan: Completion,
    requested_by: str,
    reason: str,
) -> int:
    """Commit ``plan`` (compare-and-set on its ``planned_from``); its snapshot id."""
    group = spec.consumer_group_id
    properties = props.commit_properties(
        group_id=group,
        offsets=plan.kept,
        commit_id=uuid.uuid4().hex,
        cluster_id=plan.cluster_id,
        pipeline=spec.name,
        requested_by=requested_by,
        reason=reason,
    )
    properties[ROUTE_ENDED] = encode_positions(plan.dropped)
    # The table keeps where the dropped partitions were read to after expiry (audit watermark).
    earlier = decode_positions(table.properties.get(DROPPED_PREFIX + group, "{}"))
    commit = ActionCommit(
        spec.name,
        "failback completion",
        spec.table,
        str(table.metadata.table_uuid),
        {group: plan.planned_from},
        properties,
        table_properties={DROPPED_PREFIX + group: encode_positions({**earlier, **plan.dropped})},
    )
    return commit_action(catalog, commit)
