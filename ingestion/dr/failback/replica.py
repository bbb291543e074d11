"""Before a failback's completion: has MM2's reverse flow copied everything from the replica?

A completion (``ingestion.dr.failback.complete``) drops the reverse copies once the table has read
them to their end on the primary. That end only proves what MM2 has copied so far: records the
replica still holds that the reverse flow has not copied (it lags, or was stopped with a
backlog) would never be read after the completion. So for each reverse-copy partition the
replica's topic it copies (the failback's plan names it) must end with a record whose byte-for-
byte copy (timestamp, key, value and headers) is the reverse copy's last record below the
table's position: MM2 copies in order, so everything before it was copied too. Refused
(:class:`~ingestion.exceptions.FailoverRefusedError`, nothing changed) when it is not, or when
the replica does not answer (what it holds cannot be shown copied), unless the failback was a
``--source-lost`` one that recorded that replica lost (``ingestion.dr.failback.lost``, R55): the
operator accepted then that its records not copied back are lost, so a replica that still does
not answer is not waited for (said in the completion's lines); one that answers is checked.
Reads only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from confluent_kafka import KafkaException

from ingestion.dr.failback.lost import FAILOVER_SOURCE_LOST
from ingestion.dr.failback.origin import FAILOVER_PLAN
from ingestion.dr.replica_reader import Replica
from ingestion.exceptions import FailoverRefusedError, ReadError
from ingestion.kafka.ranges import Key
from ingestion.table.offsets import snapshot_properties
from ingestion.table.route import SWITCH_SNAPSHOT, active_switch

if TYPE_CHECKING:
    from pyiceberg.table import Table


def check_replica_copied(
    table: Table,
    group_id: str,
    drained: dict[Key, int],
    replicas: dict[str, Replica],
    primary: Replica,
    pipeline: str,
) -> list[str]:
    """Refuse unless every replica topic behind a drained reverse copy (``drained``: its
    partitions and the table's offsets there) is copied to its end (module docstring).
    ``replicas`` are the clusters the pipeline may have failed back from, by name. Returns a
    line per replica not checked because the failback recorded it lost and it does not answer."""
    route = active_switch(table, group_id) or {}
    switch = table.metadata.snapshot_by_id(int(route.get(SWITCH_SNAPSHOT, "-1")))
    properties = snapshot_properties(switch) if switch else {}
    plans = orjson.loads(properties.get(FAILOVER_PLAN, "[]"))
    lost = orjson.loads(properties.get(FAILOVER_SOURCE_LOST, "{}")).get("lost")
    skipped: set[str] = set()
    for entry in plans:
        copy, partition = str(entry["replica_topic"]), int(entry["partition"])
        if (copy, partition) not in drained:
            continue
        source = str(entry["source_topic"])
        where = f"pipeline {pipeline!r}: reverse copy {copy}[{partition}] of {source}[{partition}]"
        for name, replica in sorted(replicas.items()):
            if name in skipped:
                continue
            try:
                low, high = replica.watermarks(source, partition)
                last = replica.last_record_before(source, partition, high) if high > low else None
            except (KafkaException, ReadError) as exc:
                if name == lost:  # the operator asserted it lost at the failback (R55)
                    skipped.add(name)
                    continue
                raise FailoverRefusedError(
                    f"{where}: replica {name!r} does not answer ({exc}), so it cannot be shown "
                    "that MM2 copied everything it holds; completing would lose what it did not. "
                    "Nothing was changed; complete once the replica answers"
                ) from exc
            if last is None:
                continue
            copied = primary.last_record_before(copy, partition, drained[(copy, partition)])
            if copied is None or not copied[1].matches(last[1]):
                raise FailoverRefusedError(
                    f"{where}: replica {name!r} holds records up to offset {last[0]} that MM2's "
                    "reverse flow has not copied into the reverse copy the table read (its last "
                    "record there is not a copy of the replica's last): they would never be "
                    "read after the completion. Let MM2 copy everything, let the pipeline ingest "
                    "it, then stop the reverse flow and complete again; nothing was changed"
                )
    return [
        f"note: replica {name!r} does not answer; the failback recorded it lost (--source-lost), "
        "so what it holds is not checked: its records MM2's reverse flow did not copy back stay "
        "lost by that assertion"
        for name in sorted(skipped)
    ]
