"""Which route a pipeline reads, as the table records it: the switch, carried by every commit.

A failover or failback commits a switch (``kafka.failover-to``, the topic names read there,
the origin topics a failback put back: ``ingestion.dr.switch``). Every run commit made
while the route is moved carries that route in ``kafka.route``, so the route survives snapshot
expiry (the switch's own snapshot may be expired hours later on a streaming pipeline): the
newest snapshot of the group that is a switch or carries a route decides, while the group's
offsets are still committed under that snapshot's cluster id (R49). A failback's completion
(``ingestion.dr.failback.complete``, marked ``kafka.route-ended``) ends the route: from it on the
pipeline reads its own topics on its own cluster, as before any switch. Reads only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from ingestion import exceptions
from ingestion.table.offsets import (
    CLUSTER_ID,
    FAILOVER_TO,
    GROUP_ID,
    OFFSETS_PREFIX,
    decode_positions,
    find_committed_state,
    iter_ancestry,
    snapshot_properties,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

PRIMARY = "primary"  # the pipeline's own cluster, in switch properties

ROUTE = "kafka.route"  # JSON of the route's switch properties, on each commit of a moved route
# JSON {spec topic: topic read since the switch}: a failback composes MM2's two namings
FAILOVER_TOPICS = "kafka.failover-topics"
# JSON list of OriginPlan: what a failback resumed on the origin topics
# (ingestion.dr.failback.origin)
FAILOVER_ORIGIN = "kafka.failover-origin"
ROUTE_KEYS = (FAILOVER_TO, FAILOVER_TOPICS, FAILOVER_ORIGIN)
# In a carried route: the switch's snapshot and the older one carrying the offsets it replaced
# (a failback reads both: ingestion.dr.failback.origin.find_switch); expiry keeps these two.
SWITCH_SNAPSHOT = "switch-snapshot-id"
REPLACED_SNAPSHOT = "replaced-snapshot-id"
# On a failback's completion: the reverse-copy partitions it dropped and the offset each was
# read to, as {"topic:partition": offset} (ingestion.table.offsets.encode_positions). Ends the
# route.
ROUTE_ENDED = "kafka.route-ended"
# Table property (it outlives expiry), per group: every partition an ended route dropped and the
# offset it was read to, as ROUTE_ENDED; the full audit's watermark for their rows.
DROPPED_PREFIX = "kafka.dropped-offsets."


def route_of(properties: dict[str, str]) -> dict[str, str] | None:
    """The route a snapshot's properties record (a switch, or a commit carrying one), or None.

    Example:
        >>> route_of({"kafka.failover-to": "dr", "kafka.records": "3"})
        {'kafka.failover-to': 'dr'}
        >>> route_of({"kafka.route": '{"kafka.failover-to": "dr"}'})
        {'kafka.failover-to': 'dr'}
        >>> route_of({"kafka.records": "3"}) is None
        True
    """
    if FAILOVER_TO in properties:
        return {key: properties[key] for key in ROUTE_KEYS if key in properties}
    if ROUTE in properties:
        return {str(k): str(v) for k, v in orjson.loads(properties[ROUTE]).items()}
    return None


def active_switch(table: Table, group_id: str) -> dict[str, str] | None:
    """The route properties of the newest switch (or commit carrying it) of ``group_id``,
    while the group's offsets are still committed under its cluster id; None without one, when
    a later commit (a reset) went elsewhere, or when a failback's completion
    (:data:`ROUTE_ENDED`) came after it."""
    committed = find_committed_state(table, group_id)
    if committed is None:
        return None
    ancestry = iter_ancestry(table)
    for snapshot in ancestry:
        properties = snapshot_properties(snapshot)
        if properties.get(GROUP_ID) != group_id:
            continue
        if ROUTE_ENDED in properties:
            return None
        route = route_of(properties)
        if route is None:
            continue
        if properties.get(CLUSTER_ID) != committed.cluster_id:
            return None
        if FAILOVER_TO in properties:  # the switch itself: name it and what it replaced
            route[SWITCH_SNAPSHOT] = str(snapshot.snapshot_id)
            key = OFFSETS_PREFIX + group_id
            replaced = next((s for s in ancestry if key in snapshot_properties(s)), None)
            if replaced is not None:
                route[REPLACED_SNAPSHOT] = str(replaced.snapshot_id)
        return route
    return None


def carried_route(table: Table, group_id: str) -> dict[str, str]:
    """The property a run commit adds to carry the active route: ``{ROUTE: ...}``, or {} when
    the pipeline reads its own cluster under its own names (no switch recorded).

    Delivery: the run commits by compare-and-set on the snapshot it planned from, so a switch
    committed in between makes that commit fail; a carried route is never older than the
    newest switch.
    """
    route = active_switch(table, group_id)
    if route is None:
        return {}
    if FAILOVER_ORIGIN in route:  # the names only: the plan stays in the switch (kept by id)
        topics = sorted({str(plan["topic"]) for plan in orjson.loads(route[FAILOVER_ORIGIN])})
        route[FAILOVER_ORIGIN] = orjson.dumps([{"topic": topic} for topic in topics]).decode()
    return {ROUTE: orjson.dumps(route).decode()}


def route_snapshots(ancestry: list[Snapshot], group_id: str) -> set[int]:
    """Snapshot ids expiry must keep so that the route of ``group_id`` stays readable: the
    path from the head back to the newest snapshot that records it (a switch, or a commit
    carrying it; an operator's reset or a quarantine replay after it carries none), and the
    switch and the snapshot whose offsets it replaced, which a failback reads by id
    (``ingestion.dr.failback.origin.find_switch``). None without a route in force (none
    recorded, the group's offsets are committed under another cluster id than the route's,
    or a failback's completion, :data:`ROUTE_ENDED`, came after it).

    Example:
        >>> from types import SimpleNamespace as S
        >>> def snap(i, **p):
        ...     p = {"kafka.group-id": "g", "kafka.cluster-id": "c", **p}
        ...     return S(snapshot_id=i, summary=S(additional_properties=p))
        >>> route = ('{"kafka.failover-to": "dr", "switch-snapshot-id": "8", '
        ...          '"replaced-snapshot-id": "6"}')
        >>> on_dr = [snap(10, **{"kafka.route": route, "kafka.offsets.g": "{}"}),
        ...          snap(9, **{"kafka.route": route, "kafka.offsets.g": "{}"}),
        ...          snap(8, **{"kafka.failover-to": "dr", "kafka.offsets.g": "{}"}), snap(7),
        ...          snap(6, **{"kafka.offsets.g": "{}"})]
        >>> sorted(route_snapshots(on_dr, "g"))
        [6, 8, 10]
        >>> back = [snap(3, **{"kafka.offsets.g": "{}", "kafka.reset-by": "ops"}),
        ...         snap(2, **{"kafka.failover-to": PRIMARY, "kafka.offsets.g": "{}"}), snap(1)]
        >>> sorted(route_snapshots(back, "g"))
        [2, 3]
        >>> sorted(route_snapshots(on_dr[2:], "g"))  # no run since the switch
        [6, 8]
        >>> route_snapshots([snap(1, **{"kafka.offsets.g": "{}"})], "g")
        set()
        >>> done = snap(4, **{"kafka.offsets.g": "{}", "kafka.route-ended": '{"dr.o:0":5}'})
        >>> route_snapshots([snap(5, **{"kafka.offsets.g": "{}"}), done, *back], "g")  # completed
        set()
    """
    key = OFFSETS_PREFIX + group_id
    committed: str | None = None
    for index, snapshot in enumerate(ancestry):
        properties = snapshot_properties(snapshot)
        if properties.get(GROUP_ID) != group_id:
            continue
        if committed is None and key in properties:
            committed = properties.get(CLUSTER_ID)
        if ROUTE_ENDED in properties:  # a completed failback: the route keeps nothing
            return set()
        route = route_of(properties)
        if route is None:
            continue
        if properties.get(CLUSTER_ID) != committed:
            return set()
        kept = {s.snapshot_id for s in ancestry[: index + 1]}
        if FAILOVER_TO in properties:  # the switch itself: on to the offsets it replaced
            replaced = next(
                (s for s in ancestry[index + 1 :] if key in snapshot_properties(s)), None
            )
            kept |= {replaced.snapshot_id} if replaced is not None else set()
        return kept | {
            int(route[name]) for name in (SWITCH_SNAPSHOT, REPLACED_SNAPSHOT) if name in route
        }
    return set()


def ended_topics(table: Table, group_id: str) -> tuple[int, set[str]] | None:
    """The completion that ended the route of ``group_id`` and the reverse copies it dropped,
    when it is the newest snapshot of the group recording a route or its end (snapshot id -1
    when expiry removed it: the table's ``kafka.dropped-offsets.<group>`` says); else None."""
    for snapshot in iter_ancestry(table):
        properties = snapshot_properties(snapshot)
        if properties.get(GROUP_ID) != group_id:
            continue
        if ROUTE_ENDED in properties:
            dropped = decode_positions(properties[ROUTE_ENDED])
            return snapshot.snapshot_id, {topic for topic, _ in dropped}
        if route_of(properties) is not None:
            return None
    # Expiry may have removed the completion (it keeps no route): the table property outlives it.
    dropped = decode_positions(table.properties.get(DROPPED_PREFIX + group_id, "{}"))
    return (-1, {topic for topic, _ in dropped}) if dropped else None


def refuse_ended_topics(
    table: Table, group_id: str, topics: list[str], unplanned: list[str], pipeline: str
) -> None:
    """Refuse a run that planned on a route a failback's completion ended: it would read a
    dropped reverse copy (one of ``unplanned``, the ``topics`` with no offsets in the table)
    from its log start again. Raises :class:`~ingestion.exceptions.CommitConflictError` (a run
    that lost a race: nothing committed; the next run, or a stream's next iteration, reads the
    pipeline's own topics)."""
    if not unplanned:
        return
    ended = ended_topics(table, group_id)
    stale = sorted(set(unplanned) & ended[1]) if ended else []
    if ended and stale:
        raise exceptions.CommitConflictError(
            f"pipeline {pipeline!r}: this run planned to read {topics}, but the failback was "
            f"completed{'' if ended[0] < 0 else f' in snapshot {ended[0]}'}: the reverse "
            f"copies {stale} are no longer read "
            "(the route ended). Nothing was committed; the next run reads the pipeline's own "
            "topics."
        )


def route_cluster(table: Table, group_id: str) -> str:
    """The name of the cluster the table's route reads now: ``primary`` without a switch (or
    after a failback's completion), else the switch's ``kafka.failover-to``."""
    switch = active_switch(table, group_id)
    return PRIMARY if switch is None else switch[FAILOVER_TO]


def refuse_other_cluster(table: Table, group_id: str, cluster: str, pipeline: str) -> None:
    """Refuse a run told it reads ``cluster`` while the table's route names another: its rows
    would record the wrong cluster in ``_kafka_cluster``, which a failback under MM2's identity
    naming trusts (``ingestion.dr.cluster_rows``). Raises
    :class:`~ingestion.exceptions.RouteClusterError` before anything is read (a switch
    committed since the caller read the route, or a caller that did not pass the route's
    cluster): nothing committed; the next run, on the route as it is now, reads again."""
    reads = route_cluster(table, group_id)
    if reads != cluster:
        raise exceptions.RouteClusterError(
            f"pipeline {pipeline!r}: the run was told it reads cluster {cluster!r}, the table's "
            f"route reads {reads!r} (group {group_id!r}). Nothing was committed; run it on the "
            "active route (platform_assets.route.active_route: pass Route.cluster as cluster)"
        )
