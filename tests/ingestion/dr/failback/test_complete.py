"""A failback ends: ``platform complete-failback`` (and the ``failover`` job's ``complete``) drops
the drained reverse copies and ends the route (docs/reliability.md, R49).

End to end on two real clusters (Apache Kafka), real MirrorMaker 2 both ways, a real SQL catalog
and the engine: failover, failback,
the reverse copy drained, then the completion; runs read the origin topic only, commits carry
no route, expiry keeps nothing for it, a reset is accepted, every record once and the audits
pass. Refused, nothing changed: on a failover to the replica, while the reverse copy has unread
records. Unit level: the route's end in ``ingestion.dr.route`` on real Iceberg snapshots.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from dagster import DagsterInstance, ExecuteInProcessResult

from ingestion.dr.failback.complete import apply_completion, plan_completion
from ingestion.dr.route import carried_route, refuse_ended_topics
from ingestion.exceptions import CommitConflictError, FailoverRefusedError
from ingestion.kafka.topics import TopicEnds
from ingestion.pipeline.hooks import FailureHooks
from ingestion.pipeline.stream import stream_pipeline
from ingestion.spec.pipeline import PipelineSpec, parse_pipeline_spec
from ingestion.table.offsets import (
    COMMIT_ID,
    FAILOVER_TO,
    OFFSETS_PREFIX,
    RESET_BY,
    RESET_REASON,
    TopicOffsets,
    iter_ancestry,
    snapshot_properties,
)
from ingestion.table.route import (
    DROPPED_PREFIX,
    FAILOVER_TOPICS,
    ROUTE,
    ROUTE_ENDED,
    active_switch,
    ended_topics,
    route_snapshots,
)
from platform_assets.cli.actions import parse_position
from platform_assets.cli.main import main
from platform_assets.dr.checks import replica_finding
from platform_assets.dr.jobs import build_failover_job
from platform_assets.dr.target import failover_target
from platform_assets.ingest.checks import audit_finding
from platform_assets.operations.actions import reset_offsets
from platform_assets.route import active_route
from platform_assets.state import read_pipeline_state
from tests.support.failback_stack import (
    STAMP,
    StackFactory,
    expire_all,
    group_offsets,
    send,
    wait_checkpointed,
)
from tests.support.history import group_commit, table_with_history

GROUP = "g"


TO_DR = group_commit(
    GROUP, "dr", {"east.o": 5}, **{FAILOVER_TO: "dr", FAILOVER_TOPICS: '{"o": "east.o"}'}
)
ON_DR = group_commit(GROUP, "dr", {"east.o": 9}, **{ROUTE: '{"kafka.failover-to": "dr"}'})
BACK = group_commit(
    GROUP,
    "pri",
    {"east.o": 2, "o": 10},
    **{FAILOVER_TO: "primary", FAILOVER_TOPICS: '{"o": "east.o"}'},
)
CARRIED = {FAILOVER_TO: "primary", FAILOVER_TOPICS: '{"o": "east.o"}'}
ON_BACK = group_commit(
    GROUP, "pri", {"east.o": 4, "o": 12}, **{ROUTE: orjson.dumps(CARRIED).decode()}
)
DONE = group_commit(GROUP, "pri", {"o": 12}, **{RESET_BY: "ops", ROUTE_ENDED: '{"east.o:0":4}'})
AFTER = group_commit(GROUP, "pri", {"o": 15})


@pytest.mark.parametrize(
    ("commits", "cluster", "kept", "ended"),
    [
        ([group_commit(GROUP, "pri", {"o": 3}), TO_DR, ON_DR], "dr", 1, None),
        ([group_commit(GROUP, "pri", {"o": 3}), TO_DR, ON_DR, BACK, ON_BACK], "primary", 1, None),
        (
            [group_commit(GROUP, "pri", {"o": 3}), TO_DR, ON_DR, BACK, ON_BACK, DONE],
            None,
            0,
            {"east.o"},
        ),
        (
            [group_commit(GROUP, "pri", {"o": 3}), TO_DR, BACK, ON_BACK, DONE, AFTER],
            None,
            0,
            {"east.o"},
        ),
        ([group_commit(GROUP, "pri", {"o": 3}), TO_DR, BACK, DONE, AFTER, TO_DR], "dr", 2, None),
    ],
    ids=["on-dr", "failed-back", "completed", "run-after", "failover-again"],
)
def test_a_completion_ends_the_route_and_a_new_switch_starts_one(
    tmp_path: Path,
    commits: list[dict[str, str]],
    cluster: str | None,
    kept: int,
    ended: set[str] | None,
) -> None:
    """After a completion no route is in force (runs carry none, expiry keeps nothing for it)
    until a new switch; ``ended_topics`` names the dropped reverse copies until then."""
    table = table_with_history(tmp_path, *commits)
    route = active_switch(table, GROUP)
    assert (route[FAILOVER_TO] if route else None) == cluster
    assert bool(carried_route(table, GROUP)) == (cluster is not None)
    assert len(route_snapshots(list(iter_ancestry(table)), GROUP)) == kept
    found = ended_topics(table, GROUP)
    assert (found[1] if found else None) == ended


def test_a_run_planned_on_an_ended_route_is_refused_before_it_reads(tmp_path: Path) -> None:
    """A run (or a stream's next iteration) that still reads the dropped reverse copy would
    read it from its log start (no offsets): refused, naming the completion. A run of the
    pipeline's own topics, or a copy that still has offsets, goes ahead."""
    table = table_with_history(
        tmp_path, group_commit(GROUP, "pri", {"o": 3}), TO_DR, BACK, ON_BACK, DONE
    )
    done = table.current_snapshot()
    assert done is not None
    with pytest.raises(CommitConflictError) as refused:
        refuse_ended_topics(table, GROUP, ["east.o", "o"], ["east.o"], "p")
    message = str(refused.value)
    assert f"failback was completed in snapshot {done.snapshot_id}" in message
    assert "['east.o'] are no longer read" in message
    assert "Nothing was committed" in message
    refuse_ended_topics(table, GROUP, ["o"], [], "p")
    refuse_ended_topics(table, GROUP, ["o", "new"], ["new"], "p")


def spec_of(topics: list[str]) -> PipelineSpec:
    return parse_pipeline_spec(
        {
            "name": "p",
            "topics": topics,
            "table": "n.t",
            "consumer_group_id": GROUP,
            "value_format": "raw",
            "replicas": [{"name": "dr", "source_alias": "east"}],
        }
    )


@pytest.mark.parametrize(
    ("commits", "ends", "refusal"),
    [
        (
            [group_commit(GROUP, "pri", {"o": 3}), TO_DR, ON_DR],
            {},
            "reads replica 'dr' since a failover",
        ),
        ([group_commit(GROUP, "pri", {"o": 3})], {}, "there is no failback to complete"),
        (
            [group_commit(GROUP, "pri", {"o": 3}), TO_DR, BACK, ON_BACK],
            {"east.o": TopicEnds("id-east.o", {0: (0, 6)})},
            r"reverse copy east.o\[0\] holds 2 record\(s\) the table has not read \(table at 4",
        ),
        (
            [group_commit(GROUP, "pri", {"o": 3}), TO_DR, BACK, ON_BACK],
            {"east.o": TopicEnds("other", {0: (0, 4)})},
            "reverse copy 'east.o' on the primary was deleted and recreated",
        ),
        (
            [group_commit(GROUP, "pri", {"o": 3}), TO_DR, BACK, ON_BACK],
            {"east.o": TopicEnds("id-east.o", {0: (0, 4), 1: (0, 1)})},
            r"reverse copy east.o\[1\] holds 1 record\(s\) the table has not read \(table at 0",
        ),
        (
            [group_commit(GROUP, "pri", {"o": 3}), TO_DR, BACK, ON_BACK],
            {"east.o": None},
            "no longer exists",
        ),
    ],
    ids=["failover-to-dr", "no-route", "unread", "recreated", "unread-partition", "missing"],
)
def test_a_completion_is_refused_unless_every_reverse_copy_is_drained(
    tmp_path: Path, commits: list[dict[str, str]], ends: dict[str, TopicEnds | None], refusal: str
) -> None:
    table = table_with_history(tmp_path, *commits)
    with pytest.raises(FailoverRefusedError, match=refusal) as refused:
        plan_completion(table, spec_of(["o"]), "pri", lambda topics: ends)
    assert "nothing was changed" in str(refused.value)


def test_a_drained_completion_keeps_the_spec_topics_at_the_tables_positions(
    tmp_path: Path,
) -> None:
    table = table_with_history(tmp_path, group_commit(GROUP, "pri", {"o": 3}), TO_DR, BACK, ON_BACK)
    ends: dict[str, TopicEnds | None] = {"east.o": TopicEnds("id-east.o", {0: (0, 4)})}
    plan = plan_completion(table, spec_of(["o"]), "pri", lambda topics: ends)
    assert plan.kept == {"o": TopicOffsets("id-o", {0: 12})}
    assert plan.dropped == {("east.o", 0): 4}
    with pytest.raises(FailoverRefusedError, match="committed against Kafka cluster 'pri'"):
        plan_completion(table, spec_of(["o"]), "other", lambda topics: ends)


def test_a_commit_between_the_plan_and_the_completion_makes_it_plan_again(tmp_path: Path) -> None:
    """A stream commits every few seconds: its commit lands after the completion was planned
    (here, while the ends are read again), so the completion's compare-and-set fails; it plans
    again from the stream's offsets and commits those, never the older ones. Each plan copies
    the owed dead letters after its read (R33): the commit that won the race may have
    left its own copy failed, and after the completion no copy searches it again (before,
    the completion copied once, before its first plan)."""
    catalog = table_with_history(
        tmp_path, group_commit(GROUP, "pri", {"o": 3}), TO_DR, BACK, ON_BACK
    ).catalog
    streamed = group_commit(
        GROUP,
        "pri",
        {"east.o": 4, "o": 14},
        **{ROUTE: orjson.dumps(CARRIED).decode(), COMMIT_ID: "streamed"},
    )
    reads: list[list[str]] = []

    def read_ends(topics: list[str]) -> dict[str, TopicEnds | None]:
        reads.append(topics)
        if len(reads) == 2:  # the stream's commit lands just before the completion's
            head = catalog.load_table("n.t")
            with (
                head.transaction() as transaction,
                transaction.update_snapshot(snapshot_properties=streamed).fast_append(),
            ):
                pass
        return {"east.o": TopicEnds("id-east.o", {0: (0, 4)})}

    copied_at: list[str | None] = []  # the head's commit each copy saw

    def copy_owed() -> None:
        head = catalog.load_table("n.t").current_snapshot()
        copied_at.append(snapshot_properties(head).get(COMMIT_ID) if head else None)

    plan, snapshot_id = apply_completion(
        catalog, spec_of(["o"]), "pri", read_ends, "ops", "done", copy_owed=copy_owed
    )
    assert len(reads) == 4  # planned, re-read, lost to the stream; planned again, re-read
    assert len(copied_at) == 2
    assert copied_at[1] == "streamed"  # the second copy covers the commit that won the race
    assert plan.kept == {"o": TopicOffsets("id-o", {0: 14})}
    table = catalog.load_table("n.t")
    head = table.current_snapshot()
    assert head is not None
    assert head.snapshot_id == snapshot_id
    assert orjson.loads(snapshot_properties(head)[ROUTE_ENDED]) == {"east.o:0": 4}
    assert active_switch(table, GROUP) is None
    assert orjson.loads(table.properties[DROPPED_PREFIX + GROUP]) == {"east.o:0": 4}


@pytest.mark.integration
def test_failover_failback_then_completion_reads_the_origin_only_and_lands_every_record_once(
    failback_stack: StackFactory,
) -> None:
    """The reverse copy delivers the replica-era records; once it is drained and MM2's reverse
    flow stopped, the completion ends the route: the runs, the lag and the route read the
    origin topic on the primary only, commits carry no route, expiry drops the switches, a
    reset is accepted again. A stream iteration in flight on the old route commits nothing
    (without the guard it re-read the dropped reverse copy from its start). Every record lands
    once; both audits pass."""
    topic, name = "cmpl", "dr_cmpl"
    aliases = {"source_alias": "eastc", "failback_source_alias": "homec"}
    stack = failback_stack(topic, name, replica=aliases, config=True)
    spec, kafka, iceberg, catalog = stack.spec, stack.kafka, stack.iceberg, stack.catalog
    source, replica, group, forward = stack.source, stack.replica, stack.group, stack.forward_mm2
    copy = stack.copy  # on the replica, and its reverse copy on the primary (identity)
    ingest_route = stack.ingest_route

    def complete(*extra: str) -> str:
        with pytest.raises(SystemExit) as refused:
            main(
                ["complete-failback", "--apply", name, "--reason", "drained", "--by", "ops", *extra]
            )
        return str(refused.value.code)

    send(source.bootstrap_servers, topic, list(range(20)), STAMP)
    ingest_route()
    with forward:
        assert forward.wait_mirrored(topic) == 20
        wait_checkpointed(forward, source, group, topic)
    # MM2 stopped: the RPO tail is never copied.
    send(source.bootstrap_servers, topic, [20, 21, 22, 23], STAMP)
    stack.fail_over()
    send(replica.bootstrap_servers, copy, [30, 31], STAMP + 10_000)
    ingest_route()

    # A failover to the replica has no completion, only a failback: refused, nothing changed.
    before = catalog.load_table(spec.table).current_snapshot()
    message = complete()
    assert f"pipeline {name!r} reads replica 'dr' since a failover" in message
    assert f"platform failover {name} --to primary" in message
    assert catalog.load_table(spec.table).current_snapshot() == before

    reverse = stack.reverse_mm2().start()  # source alias "homec", target alias "eastc"
    reverse.wait_mirrored(copy)
    wait_checkpointed(reverse, replica, group, copy)
    stack.fail_back()
    assert active_route(spec, kafka, iceberg).spec.source_topics == [copy, topic]
    send(replica.bootstrap_servers, copy, [32, 33], STAMP + 10_000)  # the last replica records
    assert reverse.wait_mirrored(copy) == 2  # copied back to the primary, not ingested yet

    # The reverse copy holds records the table has not read: refused, nothing changed.
    before = catalog.load_table(spec.table).current_snapshot()
    group_before = group_offsets(source.bootstrap_servers, group)
    message = complete()
    assert f"pipeline {name!r}: reverse copy {copy}[0] holds 1 record(s)" in message
    assert "Stop MM2's reverse flow" in message
    assert "nothing was changed" in message
    assert catalog.load_table(spec.table).current_snapshot() == before
    assert active_route(spec, kafka, iceberg).spec.source_topics == [copy, topic]
    assert group_offsets(source.bootstrap_servers, group) == group_before

    assert ingest_route() == {copy, topic}  # drains the reverse copy, and the tail k20..k23
    reverse.stop()  # the operator stops MM2's reverse flow, as the refusal said
    assert main(["complete-failback", name, "--reason", "drained"]) == 0
    assert catalog.load_table(spec.table).current_snapshot() != before  # the run, not the plan
    planned = catalog.load_table(spec.table).current_snapshot()

    # Producers are back on the primary; a stream iteration on the route is in flight when the
    # Dagster job completes the failback.
    send(source.bootstrap_servers, topic, [40, 41], STAMP)
    failover_job = build_failover_job([spec])
    outcomes: list[ExecuteInProcessResult] = []

    def complete_in_flight(point: str, **context: object) -> None:
        if outcomes:
            return
        with DagsterInstance.ephemeral() as instance:
            outcomes.append(
                failover_job.execute_in_process(
                    run_config={
                        "ops": {
                            "failover_pipeline": {
                                "config": {
                                    "pipeline": name,
                                    "complete": True,
                                    "apply": True,
                                    "reason": "reverse copy drained",
                                }
                            }
                        }
                    },
                    resources=stack.resources,
                    instance=instance,
                )
            )

    old = active_route(spec, kafka, iceberg)
    iterations = iter(range(2))
    stream = stream_pipeline(
        old.spec,
        old.kafka.client_config(),
        catalog,
        old.kafka.get_cluster_id(),
        0.1,
        should_stop=lambda: None if next(iterations, None) is not None else "done",
        on_report=lambda report: None,
        hooks=FailureHooks({"before_commit": complete_in_flight}),
    )
    assert outcomes[0].success
    # Its commit lost to the completion; its next plan, still on the old route, was refused
    # before it read the dropped reverse copy from its start. Nothing committed by it.
    assert (stream.conflicts, stream.commits) == (2, 0), stream
    table = catalog.load_table(spec.table)
    completion = table.current_snapshot()
    assert completion is not None
    assert completion != planned
    recorded = snapshot_properties(completion)
    assert recorded[RESET_REASON] == "reverse copy drained"
    assert recorded[RESET_BY].startswith("dagster run ")
    assert set(orjson.loads(recorded[OFFSETS_PREFIX + group])) == {topic}
    assert {key.split(":")[0] for key in orjson.loads(recorded[ROUTE_ENDED])} == {copy}
    route = active_route(spec, kafka, iceberg)
    assert (route.cluster, route.spec.source_topics) == ("primary", [topic])
    assert "there is no failback to complete" in complete()  # a second one: nothing to do

    lag = read_pipeline_state(spec, kafka, iceberg).lag()
    assert {key[0] for key in lag} == {topic}
    assert sum(lag.values()) == 2
    assert ingest_route() == {topic}  # the origin topic only
    head = catalog.load_table(spec.table).current_snapshot()
    assert head is not None
    assert ROUTE not in snapshot_properties(head)
    # Expiry keeps nothing for the ended route: the switches go.
    switches = [
        s.snapshot_id for s in iter_ancestry(table) if FAILOVER_TO in snapshot_properties(s)
    ]
    assert len(switches) == 2
    assert expire_all(catalog.load_table(spec.table), group) > 0
    table = catalog.load_table(spec.table)
    assert all(table.metadata.snapshot_by_id(s) is None for s in switches)
    # Where the dropped reverse copy was read to outlives the completion's snapshot: the full
    # audit's watermark for its rows.
    dropped = orjson.loads(table.properties[DROPPED_PREFIX + group])
    assert dropped == {f"{copy}:0": 12, f"{copy}:1": 12}
    assert active_route(spec, kafka, iceberg).spec.source_topics == [topic]

    # Reset, migration and a new failover are allowed again.
    # A backward reset of the origin topic (read on the primary only): its rows go, read again.
    reset = reset_offsets(spec, kafka, iceberg, parse_position("earliest"), True, "ops", "again")
    assert any("committed in snapshot" in line for line in reset), reset
    failover_target(active_route(spec, kafka, iceberg), spec, kafka, "dr")
    send(source.bootstrap_servers, topic, [42, 43], STAMP)
    assert ingest_route() == {topic}

    landed = stack.landed_keys()
    assert landed == sorted(f"k{i}" for i in [*range(24), 30, 31, 32, 33, 40, 41, 42, 43])
    audit = audit_finding(spec, iceberg, kafka)
    assert audit.passed, audit.message
    full = audit_finding(spec, iceberg, kafka, full=True)
    assert full.passed, full.message
    with forward:  # MM2 primary -> dr runs again: the replica check judges the forward flow
        forward.wait_mirrored(topic)
        wait_checkpointed(forward, source, group, topic)
        ready = replica_finding(spec, spec.replicas[0], kafka, iceberg)
    assert ready.passed, ready.message


def test_a_completion_waits_until_mm2_copied_everything_the_replica_holds(
    failback_stack: StackFactory,
) -> None:
    # The reverse copy is read to its end on the primary, but the replica still holds the last
    # records its producers wrote before moving back: MM2's reverse flow lags. Completing then
    # would never read them; it is refused until MM2 has copied them.
    topic, name = "lagc", "dr_lagc"
    aliases = {"source_alias": "eastl", "failback_source_alias": "homel"}
    stack = failback_stack(topic, name, replica=aliases, config=True)
    replica, copy, group = stack.replica.bootstrap_servers, stack.copy, stack.group
    send(stack.source.bootstrap_servers, topic, list(range(20)), STAMP)
    stack.ingest_route()
    with stack.forward_mm2 as forward:
        assert forward.wait_mirrored(topic) == 20
        wait_checkpointed(forward, stack.source, group, topic)
    stack.fail_over()
    send(replica, copy, [30, 31], STAMP + 10_000)
    stack.ingest_route()
    reverse = stack.reverse_mm2()  # source alias "homel", target alias "eastl"
    with reverse:
        reverse.wait_mirrored(copy)
        wait_checkpointed(reverse, stack.replica, group, copy)
        stack.fail_back()
    send(replica, copy, [32, 33], STAMP + 10_000)  # not copied back: MM2's reverse flow lags
    stack.ingest_route()
    head = stack.head()
    with pytest.raises(SystemExit, match="reverse flow has not copied into the reverse copy"):
        main(["complete-failback", "--apply", name, "--reason", "drained", "--by", "ops"])
    assert stack.head() == head  # nothing changed
    with reverse:  # MM2 catches up; the pipeline reads the copies; then the completion holds
        assert reverse.wait_mirrored(copy) == 2
    stack.ingest_route()
    assert main(["complete-failback", "--apply", name, "--reason", "drained", "--by", "ops"]) == 0
    stack.ingest_route()
    landed = stack.landed_keys()
    assert sorted(landed) == sorted(f"k{i}" for i in [*range(20), 30, 31, 32, 33])
    assert audit_finding(stack.spec, stack.iceberg, stack.kafka, full=True).passed
