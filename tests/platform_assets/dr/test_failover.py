"""Failover and failback wired into the platform, end to end on two real clusters.

The primary stops (SIGSTOP) in the middle of a stream, with records MM2 had not copied yet (the
RPO tail); ``platform failover --dry-run`` shows the plan and commits nothing, ``platform
failover --to dr`` switches, and the pipeline's Dagster ingestion asset then reads the replica
with no configuration change. The primary comes back, a reverse MirrorMaker 2 flow copies
the replica's topic to it, producers keep writing to the replica, and the
Dagster ``failover`` job fails the pipeline back to primary in the middle of that stream: it
reads the reverse copy and the origin topic again, from the unreplicated tail on, where
producers write once more. The oracle, by source record identity: every record once. The
exactly-once audit recounts each commit on the cluster it read.

Every flow here is Apache Kafka's MirrorMaker 2 (tests/support/mirror_maker.py), forward and
reverse, each started and stopped where the story needs MM2 running or behind: a tail MM2 never
copied is made by stopping it, and a copy that lands between the failback's plan and its commit
by starting it there."""

from __future__ import annotations

import os
import re
import shlex
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from dagster import AssetSelection, DagsterInstance

from ingestion.exceptions import FailoverRefusedError, OperationRefusedError
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import RESET_BY, RESET_REASON
from ingestion.table.route import FAILOVER_ORIGIN
from ingestion.table.schema import PRIMARY
from platform_assets.cli.actions import parse_position
from platform_assets.cli.main import main
from platform_assets.dr.checks import replica_finding
from platform_assets.dr.jobs import build_failover_job
from platform_assets.ingest.checks import audit_finding
from platform_assets.operations.actions import reset_offsets
from platform_assets.pipelines import quarantine_key, table_key
from platform_assets.route import active_route
from platform_assets.state import read_pipeline_state
from resources.spark import SparkResource
from tests.support.brokers import resume_broker
from tests.support.dagster_runs import materialize_pipeline
from tests.support.failback_stack import (
    STAMP,
    StackFactory,
    expire_all,
    group_offsets,
    send,
    wait_checkpointed,
)
from tests.support.failover_stream import oracle, produce
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import CreateTopic, Harness

pytestmark = pytest.mark.integration
NAME = "dr_wired"


def documented_failover_commands() -> list[list[str]]:
    """The ``platform failover`` lines of docs/disaster-recovery.md (dry run, switch, failback)
    for this pipeline."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "disaster-recovery.md").read_text()
    lines = re.findall(r"^ +platform (failover .+)$", text, flags=re.MULTILINE)
    commands = [shlex.split(line, comments=True) for line in lines]
    assert [c[c.index("--to") + 1] for c in commands] == ["dr", "dr", "primary"], commands
    assert "--apply" not in commands[0]  # every state-changing command: a dry run first
    assert all("--apply" in c for c in commands[1:])
    return [[NAME if word == "PIPELINE" else word for word in c] for c in commands]


def ingest(spec: PipelineSpec, resources: dict[str, Any], cap: int | None = None) -> None:
    """One run of the pipeline's Dagster ingestion asset (it reads the active route)."""
    capped = spec.model_copy(update={"max_records_per_run": cap}) if cap else spec
    selection = AssetSelection.assets(table_key(spec), quarantine_key(spec)).without_checks()
    with DagsterInstance.ephemeral() as instance:
        result = materialize_pipeline(capped, resources, selection, instance)
    assert result.success, [e.message for e in result.all_events if e.is_failure]


def test_failover_then_failback_through_the_cli_and_the_job_land_every_record_once(
    failback_stack: StackFactory,
    spark_resource: SparkResource,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # On the primary, mirrored by real MM2 (an offset sync every 9 records).
    stack = failback_stack(
        "orders",
        NAME,
        partitions=3,
        config=True,
        forward={"offset_lag_max": 8},
        errors_tolerance="all",
        max_records_per_run=70,
    )
    source, replica, forward = stack.source, stack.replica, stack.forward_mm2
    spec, kafka, iceberg, catalog = stack.spec, stack.kafka, stack.iceberg, stack.catalog
    group = stack.group

    resources = {**stack.resources, "spark": spark_resource}
    dr_admin = AdminClient({"bootstrap.servers": replica.bootstrap_servers})
    produce(source.bootstrap_servers, "orders", 0, 100)
    ingest(spec, resources)  # 70 of 100
    with forward:
        assert forward.wait_mirrored("orders") == 100
        wait_checkpointed(forward, source, group, "orders")  # the table's 70
        produce(source.bootstrap_servers, "orders", 100, 30)
        assert forward.wait_mirrored("orders") == 30
    # MM2 stopped (it falls behind): no newer checkpoint, and what follows is never copied.
    ingest(spec, resources, cap=40)  # 110 of 130: past the checkpoint
    produce(source.bootstrap_servers, "orders", 130, 10)  # the RPO tail
    os.kill(source.pid or 0, signal.SIGSTOP)  # disaster

    # dr has its own `orders` too (a producer that failed over early wrote there): under MM2's
    # default naming the route reads `primary.orders`, and the plan says so.
    for future in dr_admin.create_topics([NewTopic("orders", 3, 1)]).values():
        future.result(10)
    produce(replica.bootstrap_servers, "orders", 900, 1)
    dry_run, args, back_args = documented_failover_commands()  # the page's commands, as written
    assert main(dry_run) == 0
    shown = capsys.readouterr().out
    assert "note: 'dr' also has its own topic 'orders' (about 1 record(s))" in shown
    assert "failover of 'dr_wired': primary -> dr" in shown
    assert "orders[0] at " in shown
    assert "-> primary.orders[0] from " in shown
    assert "dry run: nothing committed" in shown
    assert active_route(spec, kafka, iceberg).cluster == "primary"
    assert main(args) == 0
    assert "switched to 'dr'" in capsys.readouterr().out
    route = active_route(spec, kafka, iceberg)
    assert (route.cluster, route.spec.source_topics) == ("dr", ["primary.orders"])
    switch = catalog.load_table(spec.table).current_snapshot()
    assert switch is not None
    assert switch.summary is not None
    recorded = switch.summary.additional_properties
    assert (recorded[RESET_BY], recorded[RESET_REASON]) == ("ops", "primary down")
    # A reset addresses the spec's topics on the primary: on a moved route it would switch the
    # pipeline back without a plan, so it is refused, nothing changed.
    with pytest.raises(OperationRefusedError, match="not supported on a moved route"):
        reset_offsets(spec, kafka, iceberg, parse_position("latest"), True, "ops", "wrong")
    assert catalog.load_table(spec.table).current_snapshot() == switch

    ingest(spec, resources)  # the Dagster asset now reads the replica: the 20 not ingested
    oracle(catalog, spec, 130)

    # The primary is back; producers write to the replica; a reverse flow copies it back.
    resume_broker(source)
    # A producer that failed over wrote to dr's own `orders`, which the route (MM2's copy under
    # default naming) does not read: the check says so, naming the topic.
    way_back = replica_finding(spec, spec.replicas[0], kafka, iceberg)
    assert not way_back.passed
    assert "'dr.checkpoints.internal' does not exist on the replica" in way_back.message
    assert (
        "topic 'orders' on the cluster the pipeline reads now holds records it does not "
        "ingest" in way_back.message
    )
    assert way_back.metadata["unread_local_records"] == 1
    for future in dr_admin.delete_topics(["orders"]).values():  # the producer is moved
        future.result(10)
    produce(replica.bootstrap_servers, "primary.orders", 140, 20)
    ingest(spec, resources, cap=10)  # 140 of 150 on the replica (k130..k139 are on the primary)
    # Source alias "dr" (the replica's failback alias), target alias "primary", identity naming.
    reverse = stack.reverse_mm2().start()
    reverse.wait_mirrored("primary.orders")
    wait_checkpointed(reverse, replica, group, "primary.orders")
    ready = replica_finding(spec, spec.replicas[0], kafka, iceberg)
    assert ready.passed, ready.message
    ingest(spec, resources, cap=5)  # 145 of 150, while MM2 checkpoints the group
    reverse.wait_mirrored("primary.orders")

    back_dry_run = [word for word in back_args if word != "--apply"]
    assert main(back_dry_run) == 0  # a dry run: the job below commits it (the same code)
    shown = capsys.readouterr().out
    for partition in (0, 1):  # k130..k139: five per partition, copied by no one
        assert re.search(
            rf"origin orders\[{partition}\] \(at \d+ before the failover\) resumes at \d+: "
            r"\d+ record\(s\) were ingested as copies on 'dr', 5 record\(s\) of unreplicated tail",
            shown,
        ), shown
    assert "origin orders[2] (at 0 before the failover) resumes at 0: 0 record(s)" in shown
    assert active_route(spec, kafka, iceberg).cluster == "dr"

    failover_job = build_failover_job([spec])
    with DagsterInstance.ephemeral() as instance:
        back = failover_job.execute_in_process(
            run_config={
                "ops": {
                    "failover_pipeline": {
                        "config": {
                            "pipeline": NAME,
                            "to": "primary",
                            "apply": True,
                            "reason": "primary is back",
                        }
                    }
                }
            },
            resources=resources,
            instance=instance,
        )
    assert back.success
    route = active_route(spec, kafka, iceberg)
    # The reverse copy and the origin topic, where the tail waits and producers write again.
    assert (route.cluster, route.spec.source_topics) == ("primary", ["primary.orders", "orders"])
    failback = catalog.load_table(spec.table).current_snapshot()
    assert failback is not None
    assert failback.summary is not None
    origin = orjson.loads(failback.summary.additional_properties[FAILOVER_ORIGIN])
    assert sorted((o["partition"], o["tail"]) for o in origin) == [(0, 5), (1, 5), (2, 0)]
    ingest(spec, resources)  # the last 5 from the primary's copy, and the 10 of the tail
    oracle(catalog, spec, 160)
    reverse.stop()  # the operator stops the reverse flow once the pipeline is back
    produce(source.bootstrap_servers, "orders", 160, 20)  # producers are back on the primary
    lag = read_pipeline_state(spec, kafka, iceberg).lag()
    assert sum(n for (topic, _), n in lag.items() if topic == "orders") == 20  # the sensor sees it
    ingest(spec, resources)
    oracle(catalog, spec, 180)
    ingest(spec, resources)
    oracle(catalog, spec, 180)
    audit = audit_finding(spec, iceberg, kafka)
    assert audit.passed, audit.message
    # Every row's coordinates too: primary.orders was read on both clusters (identity naming on
    # the way back), so its coordinates may occur once per cluster whose ranges hold them.
    full = audit_finding(spec, iceberg, kafka, full=True)
    assert full.passed, full.message
    # MM2 primary -> dr runs again, from where it stopped: it copies the tail k130..k139 and
    # k160..k179 to dr; the replica check judges the origin topic.
    with forward:
        assert forward.wait_mirrored("orders") == 30
        wait_checkpointed(forward, source, group, "orders")
        ready = replica_finding(spec, spec.replicas[0], kafka, iceberg)
        assert ready.passed, ready.message
        # The reverse flow is started again by mistake: new records of `orders` loop back into
        # its reverse copy (primary -> dr -> primary), and so do the forward flow's copies of
        # k130..k139 and k160..k179; the check names both topics before the next run reads them.
        reverse.start()
        produce(source.bootstrap_servers, "orders", 180, 6)
        assert forward.wait_mirrored("orders") == 6
        reverse.wait_mirrored("primary.orders")
        looping = replica_finding(spec, spec.replicas[0], kafka, iceberg)
    assert not looping.passed
    assert "records of 'orders' come back through 'primary.orders'" in looping.message
    assert len(looping.metadata["looped_records"]) == 5  # examples; the message has no offsets
    # Ingested anyway, the looped records are in the table twice under two names: the
    # coordinates are distinct, and the full audit still says so.
    ingest(spec, resources)
    twice = audit_finding(spec, iceberg, kafka, full=True)
    assert not twice.passed
    # 36: k160..k185, and the tail k130..k139, which the forward flow copied to dr only now.
    assert "cross_name_duplicates: 36" in twice.message, twice.message


def test_a_rewind_of_a_topic_name_read_on_two_clusters_is_refused_loudly() -> None:
    """After a failback under identity naming the table read ``primary.orders`` on two
    clusters; its rows do not record the cluster, so a backward reset that deletes
    "rows at or after X" would take rows read on the other cluster: refused, naming the
    pipeline and what to do. A forward reset, or a name read on one cluster, goes ahead."""
    from ingestion.exceptions import AmbiguousRewindError
    from ingestion.ops.reset import refuse_ambiguous_rewind

    both = {"primary.orders": {"dr-cluster", "primary-cluster"}}
    with pytest.raises(AmbiguousRewindError) as refused:
        refuse_ambiguous_rewind(NAME, {("primary.orders", 1): (79, 70)}, both)
    message = str(refused.value)
    assert f"pipeline {NAME!r}" in message
    assert "primary.orders[1] (79 -> 70)" in message
    assert "failback_replication_policy: default" in message
    assert "nothing was changed" in message
    refuse_ambiguous_rewind(NAME, {("primary.orders", 1): (79, 85)}, both)  # forward
    refuse_ambiguous_rewind(NAME, {("primary.orders", 1): (None, 0)}, both)  # first commit
    one = {"primary.orders": {"primary-cluster"}}
    refuse_ambiguous_rewind(NAME, {("primary.orders", 1): (79, 70)}, one)


def test_a_failback_whose_copies_contradict_the_origin_is_refused_nothing_changed(
    failback_stack: StackFactory,
) -> None:
    """The primary wrote k20 and k22 but MM2 copied neither; a producer then re-sent k22 (same
    timestamp and key) to the replica, not k20. The table ingested a copy of an origin record
    after one it never saw: where the unreplicated tail starts cannot be told. The failback is
    refused, naming the pipeline, the partition and the offsets; the table, the route and the
    Kafka group are unchanged."""
    name = "dr_refused"
    aliases = {"source_alias": "west", "failback_source_alias": "back"}
    stack = failback_stack("payments", name, replica=aliases)
    source, group, forward = stack.source.bootstrap_servers, stack.group, stack.forward_mm2
    send(source, "payments", list(range(20)), STAMP)
    stack.ingest_route()
    with forward:  # all 20 copied and checkpointed
        assert forward.wait_mirrored("payments") == 20
        wait_checkpointed(forward, stack.source, group, "payments")
    send(source, "payments", [20, 21, 22, 23], STAMP)  # never copied: MM2 stopped
    stack.fail_over()
    # A retry of k22, and records of the replica's producers on both partitions.
    send(stack.replica.bootstrap_servers, "west.payments", [22, 30, 31], STAMP)
    stack.ingest_route()
    with stack.reverse_mm2(target_alias="primary") as reverse:
        reverse.wait_mirrored("west.payments")
        wait_checkpointed(reverse, stack.replica, group, "west.payments")  # the table's end
    before = stack.head()
    group_before = group_offsets(source, group)

    with pytest.raises(FailoverRefusedError) as refused:
        stack.fail_back()
    message = str(refused.value)
    assert f"pipeline {name!r}: failback of origin payments[0] (offset 10)" in message
    assert "origin offset 11 has a copy on the replica" in message
    assert "although origin offset 10 before it has none" in message
    assert "Nothing was changed" in message
    assert stack.head() == before
    assert active_route(stack.spec, stack.kafka, stack.iceberg).cluster == "dr"
    assert group_offsets(source, group) == group_before


@pytest.mark.parametrize("with_syncs", [True, False], ids=["offset-syncs", "checkpoints-only"])
def test_a_partition_quiet_on_the_replica_fails_back_and_the_tail_lands_once(
    failback_stack: StackFactory, with_syncs: bool
) -> None:
    """Partition 1 got nothing on the replica after the failover, so MM2's anchor on the way
    back is a copy of a record the table read on the primary, under the origin's name: the
    failback aligns through the origin instead of refusing. The tail the primary never copied
    (k20..k23) and what producers write there after the failback land once."""
    n = int(with_syncs)
    topic, alias = f"refunds{n}", f"east{n}"
    aliases = {"source_alias": alias, "failback_source_alias": f"home{n}"}
    stack = failback_stack(topic, f"dr_quiet{n}", replica=aliases)
    spec, kafka, iceberg, catalog = stack.spec, stack.kafka, stack.iceberg, stack.catalog
    source, group, ingest_route = stack.source.bootstrap_servers, stack.group, stack.ingest_route
    send(source, topic, list(range(20)), STAMP)
    ingest_route()
    with stack.forward_mm2 as forward:
        assert forward.wait_mirrored(topic) == 20
        wait_checkpointed(forward, stack.source, group, topic)
    send(source, topic, [20, 21, 22, 23], STAMP)  # never copied: MM2 stopped
    stack.fail_over()
    send(stack.replica.bootstrap_servers, f"{alias}.{topic}", [30], STAMP)  # partition 0 only
    ingest_route()
    send(stack.replica.bootstrap_servers, f"{alias}.{topic}", [32], STAMP)  # partition 0 only
    ingest_route()
    # Expiry on a replica removes the history between the switch and the head, keeping the
    # switch and the snapshot whose offsets it replaced (the failback reads both by id) and
    # the route (every commit carries it).
    assert expire_all(catalog.load_table(spec.table), group) > 0
    assert active_route(spec, kafka, iceberg).spec.source_topics == [f"{alias}.{topic}"]
    # The reverse flow's offset syncs live on the replica, named after the forward alias when
    # MM2 calls the primary that (the failback reads them there).
    syncs_alias = alias if with_syncs else f"nowhere{n}"
    with stack.reverse_mm2(target_alias=syncs_alias) as reverse:  # source alias f"home{n}"
        reverse.wait_mirrored(f"{alias}.{topic}")
        wait_checkpointed(reverse, stack.replica, group, f"{alias}.{topic}")

    lines = stack.fail_back()
    quiet = next(line for line in lines if line.startswith(f"{alias}.{topic}[1] "))
    assert "read before the failover" in quiet, lines
    # MM2's anchor is the copy of the last record (k19, replica 9): on each offset commit its
    # source task writes the offset sync it held back for a partition's last copy, so the
    # checkpoint of a group at the end translates exactly (10 -> 10), not to a sync before it.
    assert "from 10 (0 copies already ingested" in quiet, lines
    route = active_route(spec, kafka, iceberg)
    assert (route.cluster, route.spec.source_topics) == ("primary", [f"{alias}.{topic}", topic])
    send(source, topic, [40, 41], STAMP)  # producers are back
    ingest_route()
    # Back on the primary, expiry removes the switch itself: the route lives on in the commits.
    assert expire_all(catalog.load_table(spec.table), group) > 0
    route = active_route(spec, kafka, iceberg)
    assert (route.cluster, route.spec.source_topics) == ("primary", [f"{alias}.{topic}", topic])
    send(source, topic, [42, 43], STAMP)
    ingest_route()
    landed = stack.landed_keys()
    assert landed == sorted(f"k{i}" for i in [*range(24), 30, 32, 40, 41, 42, 43])
    audit = audit_finding(spec, iceberg, kafka)
    assert audit.passed, audit.message


def test_tail_records_the_forward_flow_copied_to_the_replica_land_once(
    failback_stack: StackFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MM2's forward flow, never stopped, copies the unreplicated tail k20..k23 to the replica
    when the primary is back, after the replica producers' k30 and k31 and before the pipeline
    read them there. The reverse copy delivers those copies after the failback, so the origin
    resumes after them; nothing of the tail is read from the origin. A failback while the
    replica does not answer, or while the forward flow copies between the plan and the commit,
    is refused with nothing changed. Oracle: every record once, and the audits pass."""
    import platform_assets.dr.failover as failover_module

    topic, alias, name = "fwdres", "eastf", "dr_fwdres"
    aliases = {"source_alias": alias, "failback_source_alias": "homef"}
    stack = failback_stack(topic, name, replica=aliases)
    spec, kafka, iceberg, group = stack.spec, stack.kafka, stack.iceberg, stack.group
    source, replica, forward = stack.source, stack.replica, stack.forward_mm2
    ingest_route, fail_back = stack.ingest_route, stack.fail_back
    copy = f"{alias}.{topic}"
    send(source.bootstrap_servers, topic, list(range(20)), STAMP)
    ingest_route()
    with forward:
        assert forward.wait_mirrored(topic) == 20
        wait_checkpointed(forward, source, group, topic)
    # The RPO tail: MM2 stopped (it fell behind), the primary stops answering.
    send(source.bootstrap_servers, topic, [20, 21, 22, 23], STAMP)
    stack.fail_over()
    send(replica.bootstrap_servers, copy, [30, 31], STAMP + 10_000)
    ingest_route()
    reverse = stack.reverse_mm2()  # source alias "homef", target alias "eastf"
    with reverse:
        reverse.wait_mirrored(copy)
        wait_checkpointed(reverse, replica, group, copy)
    before = stack.head()

    os.kill(replica.pid or 0, signal.SIGSTOP)  # the replica does not answer
    try:
        with pytest.raises(FailoverRefusedError, match="the replica cluster does not answer"):
            fail_back()
    finally:
        resume_broker(replica)
    assert stack.head() == before

    planned = failover_module.plan_failback_origin

    def plan_then_copy(*args: Any, **kwargs: Any) -> Any:
        plans = planned(*args, **kwargs)
        forward.start()  # MM2's forward flow is back: it copies the tail after the plan
        assert forward.wait_mirrored(topic) == 4
        return plans

    monkeypatch.setattr(failover_module, "plan_failback_origin", plan_then_copy)
    with pytest.raises(FailoverRefusedError) as refused:
        fail_back()
    message = str(refused.value)
    assert f"pipeline {name!r}: failback of origin {topic}[0]" in message
    assert "a copy of origin offset 10" in message
    assert "MM2's forward flow still runs" in message
    assert "Nothing was changed" in message
    assert stack.head() == before
    assert active_route(spec, kafka, iceberg).cluster == "dr"
    monkeypatch.undo()
    forward.stop()

    # The copies of k20..k23 are on the replica after k30 and k31, not ingested: the origin
    # resumes after them, and the reverse copy brings them.
    lines = fail_back()
    for partition in (0, 1):
        assert (
            f"origin {topic}[{partition}] (at 10 before the failover) resumes at 12: 0 record(s) "
            "were ingested as copies on 'dr', 0 record(s) of unreplicated tail to ingest; 2 more "
            f"were copied to 'dr' since the failover and arrive through the reverse copy of "
            f"{alias}.{topic}[{partition}]"
        ) in lines, lines
    with reverse:  # the reverse flow brings the copies of the tail
        reverse.wait_mirrored(copy)
    ingest_route()
    send(source.bootstrap_servers, topic, [40, 41], STAMP)  # producers are back on the primary
    ingest_route()
    landed = stack.landed_keys()
    assert landed == sorted(f"k{i}" for i in [*range(24), 30, 31, 40, 41])
    audit = audit_finding(spec, iceberg, kafka)
    assert audit.passed, audit.message
    full = audit_finding(spec, iceberg, kafka, full=True)
    assert full.passed, full.message


def test_a_failover_copies_the_dead_letters_its_source_owed_first(
    failback_stack: StackFactory,
) -> None:
    """A run quarantined a record and its dead-letter copy failed (the broker refused to create
    the topic), so the group stayed behind. The operator creates the topic and fails over: the
    failover copies the owed letter to the primary's dead-letter topic before the switch (after
    it, runs read the replica and no run searches that commit again: before, the letter never
    reached the topic). A plain read_committed consumer reads it once; the route moved."""
    from confluent_kafka import Producer

    topic, dead = "dlqowed", "dlqowed-dlq"
    stack = failback_stack(
        topic,
        "dr_dlq_owed",
        replica={"source_alias": "westq"},
        errors_tolerance="all",
        dead_letter_topic=dead,
        dead_letter_topic_replication_factor=3,
    )
    source, group, forward = stack.source.bootstrap_servers, stack.group, stack.forward_mm2
    send(source, topic, list(range(10)), STAMP)
    stack.ingest_route()  # clean: the group follows the table
    producer = Producer({"bootstrap.servers": source})
    producer.produce(topic, key=b"bad", value=b"{oops", partition=0, timestamp=STAMP + 50)
    assert producer.flush(10) == 0
    send(source, topic, list(range(10, 14)), STAMP)
    stack.ingest_route()  # 1 quarantined; the copy refused (3 replicas on one broker)
    assert group_offsets(source, group) == {(topic, 0): 5, (topic, 1): 5}
    with forward:
        assert forward.wait_mirrored(topic) == 15
        wait_checkpointed(forward, stack.source, group, topic)
    admin = AdminClient({"bootstrap.servers": source})
    admin.create_topics([NewTopic(dead, 1, 1)])[dead].result(15)  # the operator's fix

    lines = stack.fail_over()

    assert f"copied 1 owed dead letter(s) to {dead!r} on 'primary' first" in lines, lines
    assert active_route(stack.spec, stack.kafka, stack.iceberg).cluster == "dr"
    consumer = stack.kafka.get_consumer()  # read_committed (ingestion.kafka.consumer)
    try:
        consumer.assign([TopicPartition(dead, 0, 0)])
        letters = [m.value() for m in consumer.consume(10, timeout=5) if m.error() is None]
    finally:
        consumer.close()
    assert letters == [b"{oops"]


@pytest.mark.parametrize("case", ["copies", "copy-fails", "copy-fails-refuses", "lost", "silent"])
def test_owed_dead_letters_before_a_switch_are_copied_or_named_as_left_behind(
    case: str,
    harness: Harness,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
) -> None:
    """What a failover, failback (``refuse=False``) or completion (``refuse=True``) does with
    the letters a run left owed on the cluster it leaves (``copy_owed_dead_letters``), on the
    real broker: it copies them there and says how many; a copy that fails is named as left in
    the quarantine table, or refuses a completion with nothing changed; a cluster asserted lost,
    or that did not answer the caller's probe, is not asked."""
    from platform_assets.dr.failover import copy_owed_dead_letters
    from platform_assets.route import Route
    from tests.ingestion.quarantine.test_bad_input import read_letters
    from tests.support.pipelines import make_spec, records

    topic = create_topic(partitions=1)
    dead = f"{topic}-owed"
    spec = make_spec(
        topic,
        f"owed_{case.replace('-', '_')}",
        errors_tolerance="all",
        dead_letter_topic=dead,
        dead_letter_topic_replication_factor=3,
    )
    ledger_producer.produce(topic, [*records(3), (b"bad", b"{owed", None)])
    assert harness.run(spec).dead_letter_error is not None  # 3 replicas on one broker: owed
    fixed = spec.model_copy(update={"dead_letter_topic_replication_factor": -1})
    route = Route(PRIMARY, spec if case.startswith("copy-fails") else fixed, harness.kafka)
    lost, answers = case == "lost", False if case == "silent" else None

    def act() -> list[str]:
        return copy_owed_dead_letters(
            harness.catalog,
            route,
            lost,
            "the failover",
            refuse=case == "copy-fails-refuses",
            answers=answers,
        )

    if case == "copy-fails-refuses":
        with pytest.raises(OperationRefusedError, match="INVALID_REPLICATION_FACTOR"):
            act()
        return
    lines = act()
    if case == "copies":
        assert lines == [f"copied 1 owed dead letter(s) to {dead!r} on 'primary' first"]
        assert read_letters(harness, dead) == [b"{owed"]
        return
    (line,) = lines
    why = {"copy-fails": "the copy failed", "lost": "(lost)", "silent": "it does not answer"}
    assert why[case] in line, line
    assert f"they stay in {spec.quarantine_table}" in line, line
    if case == "copy-fails":
        assert "INVALID_REPLICATION_FACTOR" in line, line
