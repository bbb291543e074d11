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


def route_depth(ancestry: list[Snapshot], group_id: str) -> int:
    """How many of the newest snapshots (``ancestry``, newest first) expiry must keep so that
    the route of ``group_id`` stays readable: back to the newest snapshot that records it (a
    switch, or a commit carrying it; an operator's reset or a quarantine replay after it
    carries none) and, while the group reads a replica, on past its failover switch to the
    older snapshot carrying the group's offsets, which a failback needs
    (``ingestion.failback_origin.find_switch``: the switch's plan and the offsets it replaced).
    0 without a route in force (none recorded, or the group's offsets are committed under
    another cluster id than the route's: the route no longer applies).

    Example:
        >>> from types import SimpleNamespace as S
        >>> def snap(**p):
        ...     p = {"kafka.group-id": "g", "kafka.cluster-id": "c", **p}
        ...     return S(summary=S(additional_properties=p))
        >>> carried = {"kafka.route": '{"kafka.failover-to": "dr"}', "kafka.offsets.g": "{}"}
        >>> on_dr = [snap(**carried),
        ...          snap(**{"kafka.failover-to": "dr", "kafka.offsets.g": "{}"}), snap(),
        ...          snap(**{"kafka.offsets.g": "{}"}), snap(**{"kafka.offsets.g": "{}"})]
        >>> route_depth(on_dr, "g")
        4
        >>> back = [snap(**{"kafka.offsets.g": "{}", "kafka.reset-by": "ops"}),
        ...         snap(**{"kafka.failover-to": PRIMARY, "kafka.offsets.g": "{}"}), snap()]
        >>> route_depth(back, "g")
        2
        >>> route_depth([snap(**{"kafka.offsets.g": "{}"})], "g")
        0
    """
    key = OFFSETS_PREFIX + group_id
    committed: str | None = None
    for index, snapshot in enumerate(ancestry):
        properties = snapshot_properties(snapshot)
        if properties.get(GROUP_ID) != group_id:
            continue
        if committed is None and key in properties:
            committed = properties.get(CLUSTER_ID)
        route = route_of(properties)
        if route is None:
            continue
        if properties.get(CLUSTER_ID) != committed:
            return 0
        if route.get(FAILOVER_TO) == PRIMARY:
            return index + 1
        switch = next(
            (i for i in range(index, len(ancestry))
             if FAILOVER_TO in snapshot_properties(ancestry[i])
             and snapshot_properties(ancestry[i]).get(GROUP_ID) == group_id),
            None,
        )  # fmt: skip
        if switch is None:
            return index + 1
        before = next(
            (i for i in range(switch + 1, len(ancestry))
             if key in snapshot_properties(ancestry[i])),
            len(ancestry) - 1,
        )  # fmt: skip
        return before + 1
    return 0
