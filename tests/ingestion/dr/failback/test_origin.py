"""Failback to the primary on two real clusters, where the unreplicated tail is hard to place.

A keyless topic writes bursts in one millisecond, and the replica's producers write in that
millisecond too: by Kafka timestamp and key the tail records and the replica's records look the
same. And partitions added to the origin after the table's last commit there, which the failover's
plan lacks. Oracle: the ids the data table holds, every record once, and the audits pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.catalog import Catalog

from ingestion.dr.mm2 import offset_syncs_topic
from ingestion.dr.replica_reader import read_offset_syncs
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.checks import audit_finding
from resources.embedded import EmbeddedBroker
from tests.support.failback_stack import STAMP, StackFactory, wait_checkpointed
from tests.support.pipelines import records

pytestmark = pytest.mark.integration


def send(
    bootstrap: str,
    topic: str,
    numbers: list[int],
    partition: Callable[[int], int],
    keyed: bool,
    stamp: Callable[[int], int] = lambda number: STAMP + number,
) -> None:
    """Records with ids ``numbers``, stamped ``stamp(n)`` (CreateTime), keyless unless
    ``keyed`` (key ``k<n>``)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for number in numbers:
        ((key, value, _),) = records(1, first=number)
        producer.produce(
            topic,
            value=value,
            key=key if keyed else None,
            partition=partition(number),
            timestamp=stamp(number),
        )
        producer.flush(10)  # one record per batch (Tansu's end offset is its last batch's base + 1)


def landed_ids(catalog: Catalog, spec: PipelineSpec) -> list[int]:
    """The ids the data table holds, sorted (a record landed twice shows twice)."""
    table = catalog.load_table(spec.table)
    return sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


@pytest.mark.parametrize("with_syncs", [True, False], ids=["offset-sync-anchor", "no-anchor"])
def test_a_keyless_burst_topic_fails_back_with_every_record_once(
    failback_stack: StackFactory, with_syncs: bool
) -> None:
    """Every record is keyless; the last ones on the primary (20..27) are stamped in one
    millisecond. MM2 copied 20..23, not 24..27; the replica's producers then wrote 30..33 in
    that millisecond, and the table
    ingested them next to the copies. By timestamp and key 30..33 pass for copies of 24..27
    (before, the failback skipped those: lost); by value they do not. The origin resumes at
    24 and 26: the tail lands once. With the replica's ``target_alias`` MM2's newest forward
    offset sync pins the copied prefix. Real MM2 both ways: the forward flow is
    stopped after copying 20..23 (so 24..27 are never copied), the reverse flow runs from the
    replica's records on."""
    n = int(with_syncs)
    topic, alias = f"bursts{n}", f"west{n}"
    extra = {"target_alias": f"dr{n}"} if with_syncs else {}
    # offset.lag.max=9: MM2 writes an offset sync for a partition's first copy, after 9 more,
    # and for the last copy when its task commits
    stack = failback_stack(
        topic,
        f"dr_{topic}",
        key_format="string",
        forward={"target_alias": f"dr{n}", "offset_lag_max": 9},
        replica={"source_alias": alias, "failback_source_alias": f"home{n}", **extra},
    )
    spec, iceberg, kafka, catalog = stack.spec, stack.iceberg, stack.kafka, stack.catalog
    source, replica, forward = stack.source, stack.replica, stack.forward_mm2
    ingest_route = stack.ingest_route

    def two(number: int) -> int:
        return number % 2

    def burst(_: int) -> int:
        return STAMP + 1000

    send(source.bootstrap_servers, topic, list(range(20)), two, keyed=False)
    ingest_route()
    forward.start()
    assert forward.wait_mirrored(topic) == 20
    for partition in (0, 1):  # the group at the table's 10
        forward.wait_checkpoint(stack.group, topic, partition, 10)
    send(source.bootstrap_servers, topic, [20, 21, 22, 23], two, keyed=False, stamp=burst)
    assert forward.wait_mirrored(topic) == 4  # copied, never ingested on the primary
    forward.stop()  # MM2 falls behind: what follows is never copied
    send(source.bootstrap_servers, topic, [24, 25, 26, 27], two, False, burst)
    stack.fail_over()
    copy = f"{alias}.{topic}"
    send(replica.bootstrap_servers, copy, [30, 31, 32, 33], two, keyed=False, stamp=burst)
    ingest_route()
    assert landed_ids(catalog, spec) == [*range(24), 30, 31, 32, 33]
    reverse = stack.reverse_mm2().start()  # source alias f"home{n}", target alias f"west{n}"
    reverse.wait_mirrored(copy)
    for partition in (0, 1):
        reverse.wait_checkpoint(stack.group, copy, partition, 14)  # the table's end on dr

    # The anchor is MM2's newest forward offset sync of each partition: the copy of its last
    # tail record (11 -> 11, written when the task committed it), unless MM2 stopped before it
    # promoted that sync (then an earlier one: docs/disaster-recovery.md, "Offset syncs").
    syncs = read_offset_syncs(
        {"bootstrap.servers": source.bootstrap_servers}, offset_syncs_topic(f"dr{n}"), 10
    )
    lines = stack.fail_back()
    for partition in (0, 1):
        newest = max(syncs[(topic, partition)], key=lambda sync: sync.upstream)
        anchor = f" (copies up to offset sync {newest.upstream} -> {newest.downstream})"
        assert (
            f"origin {topic}[{partition}] (at 10 before the failover) resumes at 12: 2 record(s) "
            "were ingested as copies on 'dr', 2 record(s) of unreplicated tail to ingest"
            + (anchor if with_syncs else "")
        ) in lines, lines
    ingest_route()
    send(source.bootstrap_servers, topic, [40, 41], two, keyed=False)  # producers are back
    ingest_route()
    assert landed_ids(catalog, spec) == [*range(28), 30, 31, 32, 33, 40, 41]
    audit = audit_finding(spec, iceberg, kafka)
    assert audit.passed, audit.message
    full = audit_finding(spec, iceberg, kafka, full=True)
    assert full.passed, full.message


def test_an_origin_partition_the_failover_plan_lacks_fails_back_with_every_record_once(
    failback_stack: StackFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 2 of the origin got its first records (50..53) after the table's last commit
    on the primary; MM2 copied 50 and 51, not 52 and 53, and the pipeline read the copy's
    partition 2 on the replica from its start (with 56, a replica producer's record). The
    failover's plan lacks the partition: it was added to the topic after that commit (the
    embedded broker cannot add partitions, so the plan the failback reads is the switch's minus
    partition 2). The failback plans it from its log start: it resumes after the copies
    (before, it was not planned and read from its log start: 50 and 51 twice)."""
    import platform_assets.dr.failover as failover_module
    from ingestion.dr.failback.origin import UndoneSwitch

    topic, alias = "grown", "westg"
    stack = failback_stack(
        topic,
        f"dr_{topic}",
        partitions=3,
        key_format="string",
        replica={"source_alias": alias, "failback_source_alias": "homeg"},
    )
    spec, iceberg, kafka, catalog = stack.spec, stack.iceberg, stack.kafka, stack.catalog
    source, replica, forward, group = stack.source, stack.replica, stack.forward_mm2, stack.group
    ingest_route = stack.ingest_route
    copy = f"{alias}.{topic}"

    def two(number: int) -> int:
        return number % 2

    def third(_: int) -> int:
        return 2

    send(source.bootstrap_servers, topic, list(range(20)), two, keyed=True)
    ingest_route()
    with forward:
        assert forward.wait_mirrored(topic) == 20
        wait_checkpointed(forward, source, group, topic)
        send(source.bootstrap_servers, topic, [50, 51], third, keyed=True)
        assert forward.wait_mirrored(topic) == 2
    send(source.bootstrap_servers, topic, [52, 53], third, keyed=True)  # never copied: MM2 stopped
    stack.fail_over()
    send(replica.bootstrap_servers, copy, [30, 31], two, keyed=True)
    send(replica.bootstrap_servers, copy, [56], third, keyed=True)
    ingest_route()
    assert landed_ids(catalog, spec) == [*range(20), 30, 31, 50, 51, 56]
    with stack.reverse_mm2() as reverse:  # source alias "homeg", target alias "westg"
        reverse.wait_mirrored(copy)
        wait_checkpointed(reverse, replica, group, copy)
    found = failover_module.find_switch

    def without_partition_2(*args: Any) -> UndoneSwitch | None:
        switch = found(*args)
        assert switch is not None
        assert any(e["partition"] == 2 and e["source_next"] == 0 for e in switch.plans)
        plans = [e for e in switch.plans if e["partition"] != 2]
        return UndoneSwitch(switch.snapshot_id, plans, switch.offsets_before)

    monkeypatch.setattr(failover_module, "find_switch", without_partition_2)
    lines = stack.fail_back()
    monkeypatch.undo()
    assert (
        f"origin {topic}[2] (not in the failover's plan: from its log start 0) resumes at 2: 2 "
        "record(s) were ingested as copies on 'dr', 2 record(s) of unreplicated tail to ingest"
    ) in lines, lines
    ingest_route()
    send(source.bootstrap_servers, topic, [40, 41, 42], lambda n: n % 3, keyed=True)
    ingest_route()
    assert landed_ids(catalog, spec) == [*range(20), 30, 31, 40, 41, 42, 50, 51, 52, 53, 56]
    audit = audit_finding(spec, iceberg, kafka)
    assert audit.passed, audit.message
    full = audit_finding(spec, iceberg, kafka, full=True)
    assert full.passed, full.message


def test_an_origin_partition_without_a_copy_on_the_replica_is_all_tail(
    dr_clusters: tuple[EmbeddedBroker, EmbeddedBroker],
) -> None:
    """The origin's partition 2 has no copy partition on the replica (MM2 has not added it to
    the copy yet): nothing of it was copied, it resumes at its log start with all of it as tail,
    and the recheck before the commit passes over it."""
    from ingestion.dr.failback.copies import recheck_copies
    from ingestion.dr.failback.origin import plan_origin_partition
    from ingestion.dr.replica_reader import Replica

    source, replica = dr_clusters
    for cluster, name, count in ((source, "sparse", 3), (replica, "westp.sparse", 2)):
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        for future in admin.create_topics([NewTopic(name, count, 1)]).values():
            future.result(10)
    send(source.bootstrap_servers, "sparse", [70, 71, 72], lambda _: 2, keyed=False)
    origin = Replica({"bootstrap.servers": source.bootstrap_servers})
    copy = Replica({"bootstrap.servers": replica.bootstrap_servers})
    entry = {
        "source_topic": "sparse",
        "partition": 2,
        "replica_topic": "westp.sparse",
        "replica_start": 0,
        "in_plan": False,
    }
    plan = plan_origin_partition([], origin, copy, entry, None, "p")
    assert (plan.committed_before, plan.resume, plan.tail) == (0, 0, 3)
    assert (plan.copies_ingested, plan.copies_pending, plan.replica_end) == (0, 0, 0)
    assert not plan.in_plan
    recheck_copies([plan], copy, origin, "p")
