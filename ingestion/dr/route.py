"""A moved route at run time: carried by each commit, and the runs it refuses (R49).

The route itself (which cluster and topic names a group reads) is part of the table's format
and is read by the core (``ingestion.table.route``); what only a pipeline with replicas does
lives here: each run commit on a moved route carries it (:func:`carried_route`), a run planned
on a route a failback's completion ended is refused (:func:`refuse_ended_topics`), and so is a
run told to read another cluster than the route's (:func:`refuse_other_cluster`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from ingestion import exceptions
from ingestion.table.route import (
    FAILOVER_ORIGIN,
    ROUTE,
    active_switch,
    ended_topics,
    route_cluster,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table


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
