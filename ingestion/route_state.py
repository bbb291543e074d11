"""Which route a pipeline reads, as the table records it: the switch, carried by every commit.

A failover or failback commits a switch (``kafka.failover-to``, the topic names read there,
the origin topics a failback put back: ``ingestion.failover_commit``). Every run commit made
while the route is moved carries that route in ``kafka.route``, so the route survives snapshot
expiry (the switch's own snapshot may be expired hours later on a streaming pipeline): the
newest snapshot of the group that is a switch or carries a route decides, while the group's
offsets are still committed under that snapshot's cluster id (R49). Reads only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from ingestion.offsets import (
    CLUSTER_ID,
    FAILOVER_TO,
    GROUP_ID,
    OFFSETS_PREFIX,
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
# JSON list of OriginPlan: what a failback resumed on the origin topics (ingestion.failback_origin)
FAILOVER_ORIGIN = "kafka.failover-origin"
ROUTE_KEYS = (FAILOVER_TO, FAILOVER_TOPICS, FAILOVER_ORIGIN)


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
    while the group's offsets are still committed under its cluster id; None without one, or
    when a later commit (a reset) went elsewhere."""
    committed = find_committed_state(table, group_id)
    if committed is None:
        return None
    for snapshot in iter_ancestry(table):
        properties = snapshot_properties(snapshot)
        if properties.get(GROUP_ID) != group_id:
            continue
        route = route_of(properties)
        if route is not None:
            return route if properties.get(CLUSTER_ID) == committed.cluster_id else None
    return None


def carried_route(table: Table, group_id: str) -> dict[str, str]:
    """The property a run commit adds to carry the active route: ``{ROUTE: ...}``, or {} when
    the pipeline reads its own cluster under its own names (no switch recorded).

    Delivery: the run commits by compare-and-set on the snapshot it planned from, so a switch
    committed in between makes that commit fail; a carried route is never older than the
    newest switch.
    """
    route = active_switch(table, group_id)
    return {} if route is None else {ROUTE: orjson.dumps(route).decode()}


def undone_switch_depth(ancestry: list[Snapshot], group_id: str) -> int:
    """How many of the newest snapshots (``ancestry``, newest first) expiry must keep so that a
    failback can still find the failover it undoes (``ingestion.failback_origin.find_switch``:
    the switch's plan and the offsets it replaced): while ``group_id`` reads a replica, through
    its newest switch and the older snapshot carrying the group's offsets; 0 otherwise (the
    route itself is carried by every commit and needs no old snapshot).

    Example:
        >>> from types import SimpleNamespace as S
        >>> def snap(**p): return S(summary=S(additional_properties={"kafka.group-id": "g", **p}))
        >>> on_dr = [snap(**{"kafka.route": '{"kafka.failover-to": "dr"}'}),
        ...          snap(**{"kafka.failover-to": "dr"}), snap(), snap(**{"kafka.offsets.g": "{}"}),
        ...          snap(**{"kafka.offsets.g": "{}"})]
        >>> undone_switch_depth(on_dr, "g")
        4
        >>> undone_switch_depth([snap(**{"kafka.failover-to": PRIMARY})], "g")
        0
    """
    key = OFFSETS_PREFIX + group_id
    moved = False
    for index, snapshot in enumerate(ancestry):
        properties = snapshot_properties(snapshot)
        if properties.get(GROUP_ID) == group_id and not moved:
            route = route_of(properties)
            if route is not None and route.get(FAILOVER_TO) == PRIMARY:
                return 0
            moved = route is not None and FAILOVER_TO in properties
            if moved:
                continue
        if moved and key in properties:
            return index + 1
    return len(ancestry) if moved else 0
