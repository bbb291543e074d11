"""The route a table records: which cluster, and which topic names, a group reads now.

Without a switch a pipeline reads its own topics on its own cluster (``primary``). A failover or
failback (disaster recovery, ``ingestion.dr``) commits a switch (``kafka.failover-to``, the topic
names read there, the origin topics a failback put back: ``ingestion.dr.switch``). Every run
commit made while the route is moved carries that route in ``kafka.route``, so the route
survives snapshot expiry (the switch's own snapshot may be expired hours later on a streaming
pipeline): the newest snapshot of the group that is a switch or carries a route decides, while
the group's offsets are still committed under that snapshot's cluster id (R49). A failback's
completion (``ingestion.dr.failback.complete``, marked ``kafka.route-ended``) ends the route.

This is part of the table's format, read by the core: maintenance keeps the snapshots a route
needs (:func:`route_snapshots`), the audit and a reset ask which cluster the route reads
(:func:`route_cluster`). Only ``ingestion.dr`` writes a route. Reads only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

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
# On a failback's completion: the reverse-copy partitions it dropped and the offset each was read
# to, as {"topic:partition": offset} (ingestion.table.offsets.encode_positions). Ends the route.
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
    if committed.from_position and ROUTE_ENDED not in committed.properties:
        return route_of(committed.properties)  # the commits were expired by another tool (R56)
    return None


def active_cluster(table: Table, group_id: str) -> str | None:
    """The cluster the table says the group reads: the newest switch's target while the group's
    offsets are still committed under that target's cluster id; None (the pipeline's own
    cluster) when no switch was committed, a later commit (a reset) went back to another, or a
    failback's completion ended the route."""
    switch = active_switch(table, group_id)
    return None if switch is None else switch[FAILOVER_TO]


def active_topics(table: Table, group_id: str) -> dict[str, str] | None:
    """The newest switch's topic names, ``{spec topic: topic read}``, while it is active
    (:func:`active_cluster`); None without one, or for a switch that did not record them."""
    switch = active_switch(table, group_id)
    names = None if switch is None else switch.get(FAILOVER_TOPICS)
    return dict(orjson.loads(names)) if names else None


def active_origins(table: Table, group_id: str) -> list[str]:
    """The origin topics a failback to the pipeline's own cluster put back on the route next
    to the reverse copies (``ingestion.dr.failback.origin``), while that switch is active."""
    switch = active_switch(table, group_id)
    plans = orjson.loads(switch.get(FAILOVER_ORIGIN, "[]")) if switch else []
    return sorted({str(plan["topic"]) for plan in plans})


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


def route_cluster(table: Table, group_id: str) -> str:
    """The name of the cluster the table's route reads now: ``primary`` without a switch (or
    after a failback's completion), else the switch's ``kafka.failover-to``."""
    switch = active_switch(table, group_id)
    return PRIMARY if switch is None else switch[FAILOVER_TO]
