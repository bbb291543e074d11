"""A failback to the primary: the replica partitions' links to the origin topics, and where the
origin topics resume (their unreplicated tail). Used by :mod:`platform_assets.dr.failover`.

MM2's forward offset syncs (on the primary, ``mm2-offset-syncs.<target_alias>.internal``, read
when the replica names its ``target_alias``) anchor the copied prefix of each origin partition.

Delivery: reads only; the switch that commits the result is ``ingestion.dr.switch``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion.dr.cluster_rows import labelled_cluster
from ingestion.dr.failback.copies import UNREACHABLE
from ingestion.dr.failback.link import OriginLink
from ingestion.dr.failback.lost import LostReplica
from ingestion.dr.failback.origin import OriginPlan, UndoneSwitch, plan_origin
from ingestion.dr.failover import Fallback
from ingestion.dr.mm2 import offset_syncs_topic
from ingestion.dr.replica_reader import Replica, read_offset_syncs
from ingestion.dr.scanned_rows import Scans
from ingestion.exceptions import FailoverRefusedError
from ingestion.kafka.ranges import Key
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.route import PRIMARY, Route
from resources.kafka import KafkaResource

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

REPLICA_TIMEOUT_S = 10.0  # the replica a failback leaves: reading it is refused after this
SYNCS_TIMEOUT_S = 5.0  # MM2's forward offset syncs on the primary: unread (no anchor) after this


def origin_links(
    switch: UndoneSwitch,
    offsets: dict[Key, int],
    names: dict[str, str],
    pipeline: str,
    labelled: str | None = None,
    source_down: bool = False,
) -> dict[Key, Fallback]:
    """Per replica partition the failover moved, its link to the origin partition it copied
    (``labelled``: see :func:`failback_labels`; ``source_down``: the replica is lost, the
    reverse copy may end before the table's position: ``ingestion.dr.failback.lost``)."""
    links: dict[Key, Fallback] = {}
    for entry in switch.plans:
        key = (str(entry["replica_topic"]), int(entry["partition"]))
        if key in offsets and key[0] in names:
            links[key] = OriginLink(
                key,
                offsets[key],
                names[key[0]],
                (str(entry["source_topic"]), key[1]),
                int(entry["source_next"]),
                int(entry["replica_start"]),
                pipeline,
                PRIMARY if labelled else None,
                labelled,
                source_down,
                int(entry.get("uncopied", 0)),
            )
    return links


def failback_labels(
    spec: PipelineSpec, catalog: Catalog, route: Route, switch: UndoneSwitch | None
) -> tuple[str | None, dict[Key, list[int]]]:
    """For a failback from ``route``: the replica's name when a replica topic has its origin's
    name (MM2's ``identity`` naming) and ``_kafka_cluster`` tells the rows read on each cluster
    apart, so that every reader of the plan filters by it; else None (the names tell them apart,
    or rows written before the column do not: ``ingestion.dr.cluster_rows``); and the ambiguous
    offsets per origin partition. The quarantine table is synced first (reads and idempotent
    writes only, as the plan's own sync)."""
    from ingestion.quarantine.sync import sync_quarantine

    if switch is None:
        return None, {}
    sync_quarantine(catalog, spec)
    tables = [catalog.load_table(spec.table)]
    if spec.quarantine_table and catalog.table_exists(spec.quarantine_table):
        tables.append(catalog.load_table(spec.quarantine_table))
    return labelled_cluster(tables, switch.plans, route.cluster)


def origin_topics(spec: PipelineSpec, route: Route, names: dict[str, str]) -> list[str]:
    """The origin topics a failback to the primary reads again: each replica topic's origin,
    unless it has the name of its reverse copy (MM2's identity policy both ways, a replication
    cycle MM2 cannot break: that topic is the reverse copy, read as before)."""
    originals = dict(zip(route.spec.source_topics, spec.source_topics, strict=True))
    return [originals[t] for t, copy in names.items() if copy != originals[t]]


def refuse_unreachable_replica(spec: PipelineSpec, route: Route, names: dict[str, str]) -> None:
    """Refuse a failback without ``--source-lost`` whose replica did not answer its probe
    (``REPLICA_TIMEOUT_S``), before the plan reads anything, when the plan would have to read
    it: there are origin topics whose tail MM2 may have copied there. Nothing was changed."""
    if origin_topics(spec, route, names):
        raise FailoverRefusedError(
            f"pipeline {spec.name!r}: "
            + UNREACHABLE.format(error=f"no metadata answer within {REPLICA_TIMEOUT_S:g} s")
        )


def plan_failback_origin(
    spec: PipelineSpec,
    catalog: Catalog,
    route: Route,
    primary: KafkaResource,
    names: dict[str, str],
    replica_next: dict[Key, int],
    switch: UndoneSwitch | None,
    labelled: str | None = None,
    ambiguous: dict[Key, list[int]] | None = None,
    lost: LostReplica | None = None,
    scans: Scans | None = None,
) -> list[OriginPlan]:
    """The origin topics a failback to the primary reads again (``ingestion.dr.failback.origin``).

    The replica it leaves is read too (``ingestion.dr.failback.copies``): tail records MM2's
    forward flow copied there arrive through the reverse copy; refused when it does not answer.
    An origin with the name of its reverse copy (MM2's identity policy both ways, a replication
    cycle MM2 cannot break) is left out: that topic is the reverse copy, read as before.
    ``labelled`` and ``ambiguous``: :func:`failback_labels`. ``lost``: the operator asserts
    the replica is lost (``--source-lost``); it is not read, its records are what the table and
    the reverse copy show (``ingestion.dr.failback.lost``). ``scans``: the plan's table scans
    (``ingestion.dr.scanned_rows``).
    """
    origins = origin_topics(spec, route, names)
    if not origins:
        return []
    if switch is None:
        raise FailoverRefusedError(
            f"pipeline {spec.name!r}: the failover to {route.cluster!r} is not in the table's "
            "history (expired?), so the origin topics' positions before it are unknown; "
            "nothing was changed"
        )
    tables = [catalog.load_table(spec.table)]
    if spec.quarantine_table and catalog.table_exists(spec.quarantine_table):
        tables.append(catalog.load_table(spec.quarantine_table))  # synced by the plan
    reader = Replica(primary.client_config())
    replica = lost or Replica(route.kafka.client_config(), REPLICA_TIMEOUT_S)
    alias = spec.replica(route.cluster).target_alias
    syncs = (
        read_offset_syncs(primary.client_config(), offset_syncs_topic(alias), SYNCS_TIMEOUT_S)
        if alias
        else {}
    )
    return plan_origin(
        tables,
        reader,
        replica,
        switch,
        origins,
        replica_next,
        spec.name,
        syncs,
        labelled,
        ambiguous,
        scans=scans,
    )


def describe_origin(origin: list[OriginPlan], replica: str) -> list[str]:
    """One line per origin partition a failback reads again: where, and the tail it ingests."""
    return [
        f"origin {o.topic}[{o.partition}] ("
        + (
            f"at {o.committed_before} before the failover"
            if o.in_plan
            else f"not in the failover's plan: from its log start {o.committed_before}"
        )
        + f") resumes at {o.resume}: {o.copies_ingested} record(s) were ingested as copies on "
        f"{replica!r}, {o.tail} record(s) of unreplicated tail to ingest"
        + (f" (copies up to {o.anchor})" if o.anchor else "")
        + (
            f"; {o.copies_pending} more were copied to {replica!r} since the failover and "
            f"arrive through the reverse copy of {o.replica_topic}[{o.partition}]"
            if o.copies_pending
            else ""
        )
        for o in origin
    ]
