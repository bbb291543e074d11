"""The second disaster: the replica a pipeline failed over to is lost, and it fails back (R55).

The primary goes down with an RPO tail (k20..k23: MM2 never copied them), the pipeline fails
over to 'dr' and ingests what producers write there; MM2's reverse flow (dr -> primary) copies
some of it back. Then 'dr' is lost (SIGSTOP: it does not answer). A failback without
``--source-lost`` is refused naming the flag, nothing changed; with it the plan reads neither
'dr' nor its offset syncs: the reverse copy resumes after the copies of ingested records, the
origin after the records whose copies the table or the reverse copy holds. Producers write on
the primary again. Oracle by record key (plain pyiceberg scans): every record that still exists
once; missing exactly the 'dr' records the reverse flow had not copied (the operator's loss).
The identity-naming cases fail back through the Dagster ``failover`` job (``source_lost:
true``). Real brokers (two), real MirrorMaker 2 both ways (each flow started and stopped where
the story needs it running or behind), a real catalog, real engine runs; nothing mocked.
"""

from __future__ import annotations

import os
import signal

import orjson
import pytest
from dagster import DagsterInstance

from ingestion.dr.failback.lost import FAILOVER_SOURCE_LOST
from ingestion.dr.late_copies.guard import read_guard
from ingestion.exceptions import FailoverRefusedError
from ingestion.table.offsets import RESET_REASON, SKIPPED, snapshot_properties
from platform_assets.dr.failover import complete_failback, failover_pipeline
from platform_assets.dr.jobs import build_failover_job
from platform_assets.ingest.checks import audit_finding
from platform_assets.route import active_route
from tests.support.brokers import resume_broker
from tests.support.failback_stack import (
    STAMP,
    FailbackStack,
    StackFactory,
    group_offsets,
    send,
    wait_checkpointed,
)

pytestmark = pytest.mark.integration

# (case, dr records the reverse flow copies before dr is lost, dr records it never copies)
CASES = [
    # The reverse copy holds everything the table read on dr, and k34, k35 it did not read yet.
    pytest.param("complete", [30, 31, 32, 33, 34, 35], [36, 37], id="reverse-copy-complete"),
    # The reverse copy ends before the table's position: k32, k33 were read on dr only.
    pytest.param("behind", [30, 31], [34, 35], id="reverse-copy-behind-the-table"),
]
# MM2's naming: default (dr reads `west.t`, the reverse copy keeps that name on the primary) or
# identity (dr's copy is `t`, read at offsets the table also read on the primary: the rows'
# _kafka_cluster tells them apart; the reverse copy is `dr.t`).
NAMINGS = ["default", "identity"]


def fail_back_with_the_job(stack: FailbackStack) -> str:
    """The Dagster ``failover`` job: ``to: primary``, ``source_lost: true``, applied; its plan."""
    config = {
        "pipeline": stack.spec.name,
        "to": "primary",
        "apply": True,
        "reason": "dr lost",
        "source_lost": True,
    }
    with DagsterInstance.ephemeral() as instance:
        result = build_failover_job([stack.spec]).execute_in_process(
            run_config={"ops": {"failover_pipeline": {"config": config}}},
            resources=stack.resources,
            instance=instance,
        )
    assert result.success
    (output,) = [e.step_output_data for e in result.all_events if e.is_successful_output]
    return str(output.metadata["plan"].value)


def keys(numbers: list[int] | range) -> list[str]:
    """The record keys ``k<n>``, sorted as the table's scan is."""
    return sorted(f"k{n}" for n in numbers)


@pytest.mark.parametrize("naming", NAMINGS)
@pytest.mark.parametrize(("case", "copied", "lost"), CASES)
def test_a_failback_from_a_lost_replica_reads_every_record_that_still_exists_once(
    failback_stack: StackFactory, case: str, copied: list[int], lost: list[int], naming: str
) -> None:
    topic, alias, name = f"lost{case}{naming}", f"west{case}", f"dr_lost_{case}_{naming}"
    identity = naming == "identity"
    if identity:
        stack = failback_stack(
            topic,
            name,
            forward={"identity": True},
            replica={"replication_policy": "identity", "failback_replication_policy": "default"},
        )
    else:
        stack = failback_stack(
            topic,
            name,
            replica={"source_alias": alias, "failback_source_alias": f"home{case}"},
        )
    spec, kafka, iceberg, catalog = stack.spec, stack.kafka, stack.iceberg, stack.catalog
    source, replica, group, forward = stack.source, stack.replica, stack.group, stack.forward_mm2
    copy = topic if identity else f"{alias}.{topic}"
    reverse_copy = f"dr.{topic}" if identity else copy
    assert stack.copy == copy
    send(source.bootstrap_servers, topic, list(range(20)), STAMP)
    stack.ingest_route()
    with forward:  # k0..k19 copied and checkpointed
        assert forward.wait_mirrored(topic) == 20
        wait_checkpointed(forward, source, group, topic)
    send(source.bootstrap_servers, topic, [20, 21, 22, 23], STAMP)  # the RPO tail: MM2 stopped
    stack.fail_over()
    # dr -> primary: dr's copy as `dr.t` (identity naming), else under its own name.
    reverse = (
        stack.reverse_mm2(identity=False) if identity else stack.reverse_mm2(target_alias=alias)
    )
    send(replica.bootstrap_servers, copy, [30, 31], STAMP + 10_000)
    if case == "complete":
        send(replica.bootstrap_servers, copy, [32, 33], STAMP + 10_000)
        stack.ingest_route()  # k30..k33 on dr
        # The primary answers again and MM2's forward flow, started again, copies the RPO tail
        # k20..k23 to dr after k33 (not ingested there: the reverse copy brings them).
        with forward:
            assert forward.wait_mirrored(topic) == 4
        send(replica.bootstrap_servers, copy, [34, 35], STAMP + 10_000)  # not ingested
        with reverse:  # k0..k19, k30..k33, k20..k23, k34, k35 back on the primary
            assert reverse.wait_mirrored(copy) == 30
            wait_checkpointed(reverse, replica, group, copy)
    else:
        with reverse:  # k0..k19, k30, k31 back on the primary
            assert reverse.wait_mirrored(copy) == 22
            wait_checkpointed(reverse, replica, group, copy)
        send(replica.bootstrap_servers, copy, [32, 33], STAMP + 10_000)
        stack.ingest_route()  # k30..k33 on dr: the table is ahead of the reverse copy
    send(replica.bootstrap_servers, copy, lost, STAMP + 10_000)  # never copied back
    before, offsets_before = stack.head(), group_offsets(source.bootstrap_servers, group)
    # While dr answers, the flag is refused: the plan would not see what MM2 copied there.
    with pytest.raises(FailoverRefusedError, match=r"lost, but it answers(.|\n)*Nothing was"):
        failover_pipeline(
            spec,
            kafka,
            iceberg,
            "primary",
            dry_run=True,
            requested_by="ops",
            reason="x",
            source_lost=True,
        )

    os.kill(replica.pid or 0, signal.SIGSTOP)  # the second disaster: dr is lost
    try:
        with pytest.raises(FailoverRefusedError) as refused:
            stack.fail_back()
        message = str(refused.value)
        assert f"pipeline {name!r}" in message, message
        assert "--source-lost" in message, message
        assert "Nothing was changed" in message or "nothing was changed" in message, message
        assert stack.head() == before
        assert active_route(spec, kafka, iceberg).cluster == "dr"
        assert group_offsets(source.bootstrap_servers, group) == offsets_before

        if identity:  # through the Dagster job (config source_lost: true)
            shown = fail_back_with_the_job(stack)
        else:
            shown = "\n".join(stack.fail_back(source_lost=True))
        assert "records written on 'dr' that MM2's reverse flow had not copied" in shown, shown
        assert "are not re-read before the commit ('dr' is lost)" in shown, shown
        ahead = {0: 1, 1: 1} if case == "behind" else {}  # k32 / k33 per partition
        counts = ", ".join(f"{copy}[{p}]: {n}" for p, n in ahead.items()) or "none"
        assert f"beyond the reverse copy (no copy on the primary yet), per partition: {counts}" in (
            shown
        ), shown
        for partition in (0, 1):  # k20..k23: two per partition
            if case == "complete":  # their copies come through the reverse copy
                placed = (
                    f"resumes at 12: 0 record(s) were ingested as copies on 'dr', 0 record(s) of "
                    "unreplicated tail to ingest; 2 more were copied to 'dr' since the failover "
                    f"and arrive through the reverse copy of {copy}[{partition}]"
                )
            else:  # the originals are read
                placed = "resumes at 10: 0 record(s) were ingested as copies on 'dr', 2 record(s)"
            assert f"origin {topic}[{partition}] (at 10 before the failover) {placed}" in (shown), (
                shown
            )
        route = active_route(spec, kafka, iceberg)
        assert (route.cluster, route.spec.source_topics) == ("primary", [reverse_copy, topic])
        switch = stack.head()
        assert switch is not None
        recorded = snapshot_properties(switch)
        assert recorded[RESET_REASON] == "dr lost"
        assertion = orjson.loads(recorded[FAILOVER_SOURCE_LOST])
        assert assertion["lost"] == "dr"
        assert "lost by the operator's assertion" in assertion["accepted"]
        assert assertion["ingested_beyond_reverse_copy"] == {
            f"{copy}:{p}": n for p, n in ahead.items()
        }
        guard = read_guard(catalog.load_table(spec.table), group, name)
        if case == "behind":  # R54 on the way back: the cluster left is dr
            assert guard is not None
            # ...and the origin records the failback reads (k20..k23), from the primary: MM2's
            # forward flow could have copied them to dr (ingestion.dr.late_copies.origin)
            entries = {(u.source, u.source_topic) for e in guard.partitions.values() for u in e}
            assert entries == {("dr", copy), ("primary", topic)}
            assert sorted(guard.partitions) == [(reverse_copy, 0), (reverse_copy, 1)]
        else:
            assert guard is None

        send(source.bootstrap_servers, topic, [40, 41], STAMP + 20_000)  # producers are back
        stack.ingest_route()
        stack.ingest_route()
        still_there = [*range(24), 30, 31, 32, 33, *(c for c in copied if c > 33), 40, 41]
        assert stack.landed_keys() == keys(still_there)  # the lost ones: exactly `lost`
        if case == "complete":  # the reverse copy is drained: end the route, dr still lost
            completed = complete_failback(
                spec, kafka, iceberg, dry_run=False, requested_by="ops", reason="drained"
            )
            assert any(
                "replica 'dr' does not answer; the failback recorded it lost" in line
                for line in completed
            ), completed
            route = active_route(spec, kafka, iceberg)
            assert (route.cluster, route.spec.source_topics) == ("primary", [topic])
            send(source.bootstrap_servers, topic, [42, 43], STAMP + 20_000)
            stack.ingest_route()
            still_there += [42, 43]
            assert stack.landed_keys() == keys(still_there)
    finally:
        resume_broker(replica)

    if case == "behind":
        # dr was not lost for good: MM2's reverse flow copies on, k32 and k33 (read on dr) late,
        # then k34, k35 (never read). The late copies are recognised byte for byte, skipped.
        with reverse:
            assert reverse.wait_mirrored(copy) == 4
        stack.ingest_route(other_clusters=True)  # reads dr to compare
        assert stack.landed_keys() == keys([*range(24), *range(30, 36), 40, 41])
        table = catalog.load_table(spec.table)
        skipped = [
            orjson.loads(p[SKIPPED])
            for s in table.snapshots()
            if SKIPPED in (p := snapshot_properties(s))
        ]
        assert sum(len(o) for found in skipped for o in found.values()) == 2
    audit = audit_finding(spec, iceberg, kafka)  # each commit recounted on the cluster it read
    assert audit.passed, audit.message
    full = audit_finding(spec, iceberg, kafka, full=True)
    assert full.passed, full.message


def test_source_lost_on_a_pipeline_reading_the_primary_is_refused(
    failback_stack: StackFactory,
) -> None:
    """--source-lost --to primary asserts the replica the pipeline reads is lost: on a pipeline
    that reads the primary it is refused naming the flag, never ignored."""
    stack = failback_stack("lostnone", "dr_lost_none")
    send(stack.source.bootstrap_servers, "lostnone", list(range(4)), STAMP)
    stack.ingest_route()
    before = stack.head()
    with pytest.raises(FailoverRefusedError, match="--source-lost with --to primary") as refused:
        failover_pipeline(
            stack.spec,
            stack.kafka,
            stack.iceberg,
            "primary",
            dry_run=True,
            requested_by="ops",
            reason="x",
            source_lost=True,
        )
    assert "nothing was changed" in str(refused.value)
    assert stack.head() == before


@pytest.mark.parametrize("anchor", ["before-start", "after-start"])
def test_a_chain_of_both_disasters_in_one_partition_skips_each_late_copy_once(
    failback_stack: StackFactory, anchor: str
) -> None:
    """R54 then R55 in one partition: a ``--source-lost`` failover leaves an uncopied tail
    (k20, k22: ingested on the primary, never copied), producers write k24, k26 there that the
    table never read (R49's tail); on dr the table reads k30..k36, the reverse flow copies back
    k30, k32 only, and MM2's forward flow copies k20..k26 to dr after k36. Then dr is lost and
    the pipeline fails back with ``--source-lost``: the table holds k34, k36 without a reverse
    copy (from dr), and the failback reads k24, k26 on the origin, blind to their copies on dr.
    The guard of that one reverse-copy partition keeps every entry: from the primary (the
    failover's k20, k22 and the failback's k24, k26) and from dr (k34, k36). dr comes back and
    its reverse flow delivers all six late: each skipped byte for byte, every record once.
    ``anchor``: the reverse flow's checkpoint falls before the failover's start (it ran before
    the table read dr: the failback aligns through the origin, whose k20, k22 dr never got,
    ``ingestion.dr.failback.link``) or after it."""
    topic, alias = f"chain{anchor[0]}", f"westchain{anchor[0]}"
    name = f"dr_lost_chain_{anchor[0]}"
    stack = failback_stack(
        topic,
        name,
        partitions=1,
        replica={"source_alias": alias, "failback_source_alias": f"home{anchor[0]}"},
    )
    spec, kafka, iceberg, catalog = stack.spec, stack.kafka, stack.iceberg, stack.catalog
    source, replica, group, copy = stack.source, stack.replica, stack.group, stack.copy
    forward = stack.forward_mm2
    even = range(0, 40, 2)  # `send` puts k<n> on partition n % 2: even numbers, partition 0
    send(source.bootstrap_servers, topic, list(even[:10]), STAMP)
    stack.ingest_route()
    with forward:  # k0..k18 copied and checkpointed; then MM2 stops (falls behind)
        assert forward.wait_mirrored(topic) == 10
        wait_checkpointed(forward, source, group, topic)
    send(source.bootstrap_servers, topic, [20, 22], STAMP)
    stack.ingest_route()  # ingested, never copied: the failover's uncopied tail
    send(source.bootstrap_servers, topic, [24, 26], STAMP)  # neither ingested nor copied

    os.kill(source.pid or 0, signal.SIGSTOP)  # the first disaster
    try:
        failover_pipeline(
            spec,
            kafka,
            iceberg,
            "dr",
            dry_run=False,
            requested_by="ops",
            reason="primary lost",
            source_lost=True,
        )
    finally:
        resume_broker(source)
    reverse = stack.reverse_mm2(target_alias=alias)
    send(replica.bootstrap_servers, copy, [30, 32], STAMP + 10_000)
    if anchor == "after-start":
        stack.ingest_route()  # k30, k32 on dr: the reverse checkpoint names them
    with reverse:  # k0..k18, k30, k32 back on the primary
        assert reverse.wait_mirrored(copy) == 12
        # The group at 10 (before-start: mid-copy, MM2 translates it to its first sync + 1)
        # or at 12 (after-start: its sync for the last copy, exact).
        wait_checkpointed(reverse, replica, group, copy)
    send(replica.bootstrap_servers, copy, [34, 36], STAMP + 10_000)
    stack.ingest_route()  # k30..k36 on dr: ahead of the reverse copy
    with forward:  # the primary is back: MM2 copies k20..k26 to dr, after k36
        assert forward.wait_mirrored(topic) == 4

    os.kill(replica.pid or 0, signal.SIGSTOP)  # the second disaster
    try:
        shown = "\n".join(stack.fail_back(source_lost=True))
        assert f"origin {topic}[0] (at 12 before the failover) resumes at 12" in shown, shown
        assert "the switch records the origin records the failback reads" in shown.lower()
        guard = read_guard(catalog.load_table(spec.table), group, name)
        assert guard is not None
        assert list(guard.partitions) == [(copy, 0)]  # the reverse copy, one partition
        entries = {(e.source, e.source_topic): e.records for e in guard.partitions[(copy, 0)]}
        assert {k: [r[0] for r in v] for k, v in entries.items()} == {
            ("primary", topic): [10, 11, 12, 13],  # the failover's k20, k22; the origin's k24, k26
            ("dr", copy): [12, 13],  # k34, k36 at their dr offsets
        }
        stack.ingest_route()  # the origin's k24, k26
        assert stack.landed_keys() == keys([*even[:14], 30, 32, 34, 36])
    finally:
        resume_broker(replica)

    # dr was not lost for good: its reverse flow copies on, k34, k36 (read on dr), then the
    # forward flow's copies of k20..k26. Each is a late copy of a record the table holds.
    with reverse:
        assert reverse.wait_mirrored(copy) == 6
    stack.ingest_route(other_clusters=True)  # compares on dr and on the primary
    assert stack.landed_keys() == keys([*even[:14], 30, 32, 34, 36])
    table = catalog.load_table(spec.table)
    skipped = [
        orjson.loads(p[SKIPPED])
        for s in table.snapshots()
        if SKIPPED in (p := snapshot_properties(s))
    ]
    assert [sorted(found[f"{copy}:0"]) for found in skipped] == [[12, 13, 14, 15, 16, 17]]
    audit = audit_finding(spec, iceberg, kafka)
    assert audit.passed, audit.message
    full = audit_finding(spec, iceberg, kafka, full=True)
    assert full.passed, full.message
