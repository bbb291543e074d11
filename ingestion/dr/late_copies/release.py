"""The operator's release of a late-copy record (R54): the cluster a ``--source-lost`` failover
left is lost for good (``platform release-late-copies``; design:
``ingestion.dr.late_copies.guard``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from ingestion.dr.late_copies.guard import RELEASED, UNCOPIED_PREFIX, read_guard
from ingestion.exceptions import OperationRefusedError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from ingestion.spec.pipeline import PipelineSpec


def _held_per_cluster(guard: Any) -> dict[str, int]:
    """The records a guard holds, per cluster its entries name."""
    clusters: dict[str, int] = {}
    for entries in guard.partitions.values():
        for entry in entries:
            clusters[entry.source] = clusters.get(entry.source, 0) + len(entry.records)
    return clusters


def count_guard(catalog: Catalog, spec: PipelineSpec) -> tuple[int, dict[str, int]]:
    """What :func:`release_guard` would release now (its dry run): the records and the records
    per cluster; reads only.

    Raises:
        OperationRefusedError: no such record is in force.
    """
    guard = read_guard(catalog.load_table(spec.table), spec.consumer_group_id, spec.name)
    if guard is None:
        raise OperationRefusedError(
            f"pipeline {spec.name!r}: no record of uncopied records is in force on its route "
            "(no --source-lost failover left any, or it was released); nothing to release"
        )
    clusters = _held_per_cluster(guard)
    return sum(clusters.values()), clusters


def release_guard(
    catalog: Catalog, spec: PipelineSpec, requested_by: str, reason: str
) -> tuple[int, dict[str, int]]:
    """Stop recognising late copies on the route in force: every entry of every partition, from
    whichever cluster. The operator asserts the cluster left is lost for good (MM2 will copy
    nothing more from it), so a record sharing a timestamp and key with an uncopied one is
    another record, and runs that refuse because that cluster does not answer
    (:class:`LateCopyUnverifiedError`) ingest it instead. All, not one cluster's entries: on a
    route the late copies of every entry arrive through the one cluster the route reads copies
    from (after a failback, the replica left, whose reverse flow copies them back), so when that
    one is lost for good none can arrive any more. Returns the number of records released and
    that number per cluster the entries name.

    Delivery: one snapshot (empty, recording who, why and how many) that sets the property, by
    compare-and-set on the table's head: a switch committed meanwhile (a new record) makes it
    refuse, never overwrite. A run in flight keeps the record it read, so it may still refuse
    once. If the cluster left comes back and MM2 copies them after all, those copies are read a
    second time.

    Raises:
        OperationRefusedError: no such record is in force, or it changed since it was read.
    """
    import uuid

    from pyiceberg.exceptions import CommitFailedException

    from ingestion.table.offsets import COMMIT_ID, PIPELINE, RESET_BY, RESET_REASON
    from ingestion.table.transaction import commit_view

    key = UNCOPIED_PREFIX + spec.consumer_group_id
    first: str | None = None
    for _ in range(5):  # another commit moved the head: reload, check, apply again
        table = catalog.load_table(spec.table)
        guard = read_guard(table, spec.consumer_group_id, spec.name)
        raw = table.properties.get(key, "")
        if guard is None or (first is not None and raw != first):
            raise OperationRefusedError(
                f"pipeline {spec.name!r}: no record of uncopied records is in force on its route "
                "(no --source-lost failover left any, it was released, or a switch replaced it "
                "since); nothing changed"
            )
        first = raw
        value = orjson.loads(raw)
        clusters = _held_per_cluster(guard)
        released = sum(clusters.values())
        value["partitions"] = []
        value["released"] = {
            "by": requested_by,
            "reason": reason,
            "records": released,
            "clusters": clusters,
        }
        summary = {
            COMMIT_ID: uuid.uuid4().hex,
            PIPELINE: spec.name,
            RESET_BY: requested_by,
            RESET_REASON: reason,
            RELEASED: str(released),
        }
        try:
            with commit_view(table).transaction() as transaction:
                transaction.set_properties({key: orjson.dumps(value).decode()})
                with transaction.update_snapshot(snapshot_properties=summary).fast_append():
                    pass
        except CommitFailedException:
            continue
        return released, clusters
    raise OperationRefusedError(
        f"pipeline {spec.name!r}: the table kept changing; nothing changed, run it again"
    )
