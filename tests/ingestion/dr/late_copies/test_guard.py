"""MM2's late copies after a ``--source-lost`` failover are read and skipped, never landed twice.

R54: the table ingested records from the primary that MirrorMaker 2 had not copied when the
primary died; the operator failed over with ``--source-lost``. When the primary comes back, MM2's
forward flow resumes and copies them to dr, after what producers wrote there meanwhile. The
ingestion asset reads them, recognises each byte for byte, and skips it; while the primary does
not answer, such a run refuses and commits nothing. Real brokers (two), a real catalog, the
Dagster asset and the platform CLI; the oracle by each record's key, and both audits.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import orjson
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from dagster import AssetSelection, DagsterInstance

from ingestion.dr.align import digest_record, key_digest
from ingestion.dr.failover import PartitionPlan
from ingestion.dr.late_copies.guard import (
    RELEASED,
    UNCOPIED_PREFIX,
    LateCopyGuard,
    Uncopied,
    parse_guard,
    read_guard,
    strong_id,
    uncopied_property,
)
from ingestion.dr.late_copies.task import set_aside
from ingestion.exceptions import LateCopyUnverifiedError
from ingestion.kafka.ranges import OffsetRange
from ingestion.pipeline.execute import task_metadata_json
from ingestion.pipeline.run import run_pipeline
from ingestion.table.offsets import SKIPPED, count_skipped, skipped_property, snapshot_properties
from ingestion.table.schema import load_or_create_table
from ingestion.task.spec import RawChunk, TaskResult
from platform_assets.cli.main import main
from platform_assets.ingest.checks import audit_finding
from platform_assets.pipelines import quarantine_key, table_key
from platform_assets.route import active_route
from resources.iceberg import IcebergCatalogResource
from resources.spark import SparkResource
from tests.platform_assets.dr.test_failover import ingest
from tests.support.brokers import resume_broker
from tests.support.dagster_runs import materialize_pipeline
from tests.support.failback_stack import (
    FailbackStack,
    StackFactory,
    exactly_once,
    wait_checkpointed,
)
from tests.support.failover_stream import oracle, produce
from tests.support.pipelines import make_spec

NAME = "dr_late"


def chunk(*records: tuple[int, bytes | None, bytes]) -> RawChunk:
    """A chunk of (timestamp, key, value) records at offsets 10, 11, ..."""
    raw = RawChunk(headers=[])
    for i, (stamp, key, value) in enumerate(records):
        raw.offsets.append(10 + i)
        raw.timestamps.append(stamp)
        raw.keys.append(key)
        raw.values.append(value)
        assert raw.headers is not None
        raw.headers.append(None)
    return raw


ORIGINAL = (5, b"k1", b"v1")  # a record the table ingested from the source, never copied
WEAK = frozenset({(5, key_digest(b"k1"))})
STRONG = frozenset({strong_id(5, b"k1", digest_record(b"v1", None))})


@pytest.mark.parametrize(
    ("records", "strong", "kept", "candidates", "skipped"),
    [
        ([ORIGINAL, (6, b"k2", b"v2")], None, [11], 1, []),  # not yet verified: set aside
        ([ORIGINAL, (6, b"k2", b"v2")], STRONG, [11], 0, [10]),  # the late copy: skipped
        ([(5, b"k1", b"other"), (5, b"k2", b"v1")], STRONG, [10, 11], 0, []),  # not a copy
        ([(6, b"k1", b"v1"), (5, None, b"v1")], None, [10, 11], 0, []),  # no candidate
        ([ORIGINAL, ORIGINAL], STRONG, [], 0, [10, 11]),  # MM2 copied it twice (at least once)
    ],
    ids=["candidate", "late-copy", "same-stamp-and-key-other-value", "none", "twice"],
)
def test_set_aside_skips_only_byte_for_byte_copies(
    records: list[tuple[int, bytes | None, bytes]],
    strong: frozenset[bytes] | None,
    kept: list[int],
    candidates: int,
    skipped: list[int],
) -> None:
    out, taken = set_aside(chunk(*records), WEAK, strong, keep_headers=False)
    assert (out.offsets, taken.candidates, taken.skipped) == (kept, candidates, skipped)
    assert out.headers is None  # the pipeline does not store headers: read for identity only
    assert len(out.keys) == len(out.values) == len(out.timestamps) == len(kept)


def test_one_partitions_skips_over_several_tasks_are_recorded_once() -> None:
    results = [TaskResult(OffsetRange("dr.t", 0, start, start + 4)) for start in (0, 4)]
    results[0].skipped, results[1].skipped = [1, 2, 3], [5, 6]
    recorded = {SKIPPED: skipped_property(results)}
    assert orjson.loads(recorded[SKIPPED]) == {"dr.t:0": [1, 2, 3, 5, 6]}
    assert count_skipped(recorded) == 5


def test_a_guard_written_by_the_previous_version_is_read_as_one_entry_per_partition() -> None:
    """Tables guarded before kept one entry per replica partition: still read, as is."""
    old = (
        '{"to":"dr","partitions":[{"topic":"primary.orders","partition":0,"from":"primary",'
        '"source_topic":"orders","records":[[100,5,"ab"],[101,6,null]]},{"topic":'
        '"primary.orders","partition":1,"from":"primary","source_topic":"orders","records":'
        '[[40,5,"cd"]]}]}'
    )
    parsed = parse_guard(old, "p")
    assert parsed is not None
    target, guard = parsed
    assert target == "dr"
    assert guard.partitions == {
        ("primary.orders", 0): (Uncopied("primary", "orders", ((100, 5, "ab"), (101, 6, None))),),
        ("primary.orders", 1): (Uncopied("primary", "orders", ((40, 5, "cd"),)),),
    }
    assert guard.weak_ids() == {
        ("primary.orders", 0): {(5, "ab"), (6, None)},
        ("primary.orders", 1): {(5, "cd")},
    }
    released = '{"to":"dr","partitions":[],"released":{"by":"ops","reason":"x","records":3}}'
    assert parse_guard(released, "p") is None


def test_a_failback_keeps_every_entry_of_a_partition() -> None:
    """A chain of both disasters in one partition (R55): the failback's own uncopied records
    (from dr) join the failover's (from the primary, carried to the reverse copy's name) and the
    origin records the failback reads (from the primary); none replaces another."""
    plans = [
        PartitionPlan("primary.orders", p, 14, "primary.orders", "id", 12, 12, "", len(mine), mine)
        for p, mine in ((0, ((12, 9, "k34"), (13, 9, "k36"))), (1, ()))
    ]
    carried = LateCopyGuard(
        "p",
        {("primary.orders", 0): (Uncopied("primary", "orders", ((10, 5, "k20"), (11, 5, "k22"))),)},
    )
    read = [(("primary.orders", 0), Uncopied("primary", "orders", ((12, 7, "k24"),)))]
    value = uncopied_property("g", "primary", "dr", plans, carried, read)[UNCOPIED_PREFIX + "g"]
    parsed = parse_guard(value, "p")
    assert parsed is not None
    assert parsed[0] == "primary"
    assert parsed[1].partitions == {
        ("primary.orders", 0): (
            Uncopied("dr", "primary.orders", ((12, 9, "k34"), (13, 9, "k36"))),
            Uncopied("primary", "orders", ((10, 5, "k20"), (11, 5, "k22"), (12, 7, "k24"))),
        )
    }
    assert parsed[1].weak_ids()[("primary.orders", 0)] == {
        (9, "k34"),
        (9, "k36"),
        (5, "k20"),
        (5, "k22"),
        (7, "k24"),
    }


def late_copy_stack(
    factory: StackFactory, topic: str, name: str, **overrides: Any
) -> FailbackStack:
    """Three partitions, bad records quarantined, MM2's forward flow (real, not started)
    transactional with sparse offset syncs; ``overrides`` change the spec."""
    return factory(
        topic,
        name,
        partitions=3,
        config=True,
        errors_tolerance="all",
        forward={"config": exactly_once("backup"), "offset_lag_max": 8},
        **overrides,
    )


@pytest.mark.integration
def test_late_copies_after_a_source_lost_failover_land_once(
    failback_stack: StackFactory,
    spark_resource: SparkResource,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stack = late_copy_stack(failback_stack, "orders", NAME)
    source, replica, spec, iceberg, kafka = (
        stack.source,
        stack.replica,
        stack.spec,
        stack.iceberg,
        stack.kafka,
    )
    resources = {**stack.resources, "spark": spark_resource}
    catalog, forward, group = stack.catalog, stack.forward_mm2, stack.group

    produce(source.bootstrap_servers, "orders", 0, 100)
    ingest(spec, resources)
    with forward:  # all 100 copied; the checkpoint is at the table's offsets
        assert forward.wait_mirrored("orders") == 100
        wait_checkpointed(forward, source, group, "orders")
    produce(source.bootstrap_servers, "orders", 100, 20)  # the RPO tail: MM2 stopped...
    ingest(spec, resources)  # ...but ingested
    os.kill(source.pid or 0, signal.SIGSTOP)  # the disaster
    try:
        assert (
            main(["failover", "--apply", NAME, "--to", "dr", "--source-lost", "--reason", "lost"])
            == 0
        )
        assert "20 record(s) MirrorMaker 2 had not copied" in capsys.readouterr().out
        table = catalog.load_table(spec.table)
        recorded = orjson.loads(table.properties[UNCOPIED_PREFIX + spec.consumer_group_id])
        assert recorded["to"] == "dr"
        assert {p["from"] for p in recorded["partitions"]} == {"primary"}
        assert sorted(len(p["records"]) for p in recorded["partitions"]) == [10, 10]
        produce(replica.bootstrap_servers, "primary.orders", 120, 20)  # producers moved to dr
        ingest(spec, resources)
        oracle(catalog, spec, 140)
    finally:
        resume_broker(source)  # the primary is back...

    with forward:  # ...and MM2's forward flow copies the tail to dr, after k120..k139
        assert forward.wait_mirrored("orders") == 20
    produce(replica.bootstrap_servers, "primary.orders", 140, 10)
    route = active_route(spec, kafka, iceberg)
    head = catalog.load_table(spec.table).current_snapshot()
    with pytest.raises(LateCopyUnverifiedError, match="'primary' does not answer"):
        # A run that cannot read the primary cannot tell a late copy from a record that shares
        # its timestamp and key: it refuses, nothing committed.
        run_pipeline(
            route.spec,
            route.kafka.client_config(),
            catalog,
            None,
            route.kafka.get_cluster_id(),
            cluster=route.cluster,
        )
    assert catalog.load_table(spec.table).current_snapshot() == head
    guard = read_guard(catalog.load_table(spec.table), spec.consumer_group_id, NAME)
    assert guard is not None
    assert {u.source for e in guard.partitions.values() for u in e} == {"primary"}

    selection = AssetSelection.assets(table_key(spec), quarantine_key(spec)).without_checks()
    with DagsterInstance.ephemeral() as instance:  # the asset reads the primary to compare
        result = materialize_pipeline(spec, resources, selection, instance)
    assert result.success
    (materialized,) = result.asset_materializations_for_node(f"ingest_{NAME}")[:1]
    assert materialized.metadata["late_copies_skipped"].value == 20  # shown in the Dagster UI
    oracle(catalog, spec, 150)
    skipping = catalog.load_table(spec.table).current_snapshot()
    assert skipping is not None
    assert skipping.summary is not None
    skipped = orjson.loads(skipping.summary.additional_properties[SKIPPED])
    assert sorted(skipped) == ["primary.orders:0", "primary.orders:1"]
    assert sum(len(offsets) for offsets in skipped.values()) == 20
    produce(replica.bootstrap_servers, "primary.orders", 150, 10)
    ingest(spec, resources)  # later runs read past them; nothing refers to the primary
    oracle(catalog, spec, 160)
    audit = audit_finding(spec, iceberg, kafka)  # each commit recounted on dr: skips counted
    assert audit.passed, audit.message
    full = audit_finding(spec, iceberg, kafka, full=True)
    assert full.passed, full.message


@pytest.mark.integration
def test_late_copies_the_reverse_flow_brings_back_are_skipped_after_the_failback(
    failback_stack: StackFactory,
    spark_resource: SparkResource,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The primary is back before the route read MM2's late copies on dr; a reverse flow copies
    dr back, late copies included, and the operator fails back: the guard follows the switch to
    the reverse copy, and they are skipped there."""
    name, topic = "dr_late_back", "payments"
    # Small tasks: one partition's late copies span several.
    stack = late_copy_stack(failback_stack, topic, name, max_records_per_task=4)
    source, replica, spec, iceberg, kafka = (
        stack.source,
        stack.replica,
        stack.spec,
        stack.iceberg,
        stack.kafka,
    )
    resources = {**stack.resources, "spark": spark_resource}
    catalog, forward, group, copy = stack.catalog, stack.forward_mm2, stack.group, stack.copy

    produce(source.bootstrap_servers, topic, 0, 60)
    ingest(spec, resources)
    with forward:
        assert forward.wait_mirrored(topic) == 60
        wait_checkpointed(forward, source, group, topic)
    produce(source.bootstrap_servers, topic, 60, 20)  # ingested, never copied: MM2 stopped
    ingest(spec, resources)
    os.kill(source.pid or 0, signal.SIGSTOP)
    try:
        assert (
            main(["failover", "--apply", name, "--to", "dr", "--source-lost", "--reason", "lost"])
            == 0
        )
        produce(replica.bootstrap_servers, copy, 80, 20)
        ingest(spec, resources)
        oracle(catalog, spec, 100)
    finally:
        resume_broker(source)
    with forward:  # the late copies reach dr; the route has not read them yet
        assert forward.wait_mirrored(topic) == 20
    # dr's primary.payments, late copies included, back on the primary (in transactions)
    reverse = stack.reverse_mm2(config=exactly_once("primary"), offset_lag_max=6)
    with reverse:
        reverse.wait_mirrored(copy)
        wait_checkpointed(reverse, replica, group, copy)
    assert (
        main(["failover", "--apply", name, "--to", "primary", "--reason", "primary is back"]) == 0
    )
    route = active_route(spec, kafka, iceberg)
    assert route.cluster == "primary"
    guard = read_guard(catalog.load_table(spec.table), group, name)
    assert guard is not None
    assert sorted(guard.partitions) == [(copy, 0), (copy, 1)]  # the reverse copy's names
    ingest(spec, resources)  # reads the reverse copy: the 20 late copies skipped
    oracle(catalog, spec, 100)
    produce(source.bootstrap_servers, topic, 100, 10)  # producers back on the primary
    ingest(spec, resources)
    oracle(catalog, spec, 110)
    audit = audit_finding(spec, iceberg, kafka)
    assert audit.passed, audit.message
    full = audit_finding(spec, iceberg, kafka, full=True)
    assert full.passed, full.message
    # The primary could have been lost for good: the operator stops the wait for it.
    assert main(["release-late-copies", "--apply", name, "--reason", "primary rebuilt"]) == 0
    assert (
        "released the 20 uncopied record(s) of 'dr_late_back''s route (20 read on 'primary';"
        in (capsys.readouterr().out)
    )
    table = catalog.load_table(spec.table)
    assert read_guard(table, group, name) is None
    released = orjson.loads(table.properties[UNCOPIED_PREFIX + group])["released"]
    assert released == {
        "by": os.environ.get("USER", "operator"),
        "reason": "primary rebuilt",
        "records": 20,
        "clusters": {"primary": 20},
    }
    with pytest.raises(SystemExit, match="no record of uncopied records is in force"):
        main(["release-late-copies", "--apply", name, "--reason", "again"])


@pytest.mark.integration
def test_a_release_lets_runs_ingest_a_record_that_only_looks_like_a_late_copy(
    failback_stack: StackFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """The primary is lost for good; a producer on dr re-sends an order with its event time and
    key but another value. Runs cannot compare it with the primary, so they refuse, committing
    nothing, until the operator releases the record of uncopied records: then it lands."""
    name, topic = "dr_late_release", "refunds"
    stack = failback_stack(topic, name, partitions=2, config=True, errors_tolerance="all")
    source, replica, spec, catalog = stack.source, stack.replica, stack.spec, stack.catalog
    produce(source.bootstrap_servers, topic, 0, 6)  # partition 0: k0, k2, k4
    stack.ingest_route()
    with stack.forward_mm2 as forward:
        assert forward.wait_mirrored(topic) == 6
        wait_checkpointed(forward, source, stack.group, topic)
    produce(source.bootstrap_servers, topic, 6, 2)  # k6: ingested, never copied: MM2 stopped
    stack.ingest_route()
    original = catalog.load_table(spec.table).scan(row_filter="_kafka_key = 'k6'").to_arrow()
    stamp = original.column("_kafka_timestamp").cast(pa.int64()).to_pylist()[0] // 1000
    os.kill(source.pid or 0, signal.SIGSTOP)
    try:
        assert (
            main(["failover", "--apply", name, "--to", "dr", "--source-lost", "--reason", "lost"])
            == 0
        )
        resend = Producer({"bootstrap.servers": replica.bootstrap_servers})
        value = (
            b'{"id": 6, "name": "n6 (corrected)", "amount": "6.25", "ts": "2026-11-22T10:00:00Z"}'
        )
        resend.produce(stack.copy, key=b"k6", value=value, partition=0, timestamp=stamp)
        resend.flush(10)
        head = stack.head()
        with pytest.raises(LateCopyUnverifiedError, match="release-late-copies dr_late_release"):
            stack.ingest_route()  # no cluster_config: the primary cannot be read
        assert stack.head() == head
        assert main(["release-late-copies", "--apply", name, "--reason", "primary lost"]) == 0
        assert "released the 2 uncopied record(s)" in capsys.readouterr().out  # k6, k7
        stack.ingest_route()
    finally:
        resume_broker(source)
    table = catalog.load_table(spec.table)
    names = table.scan(row_filter="_kafka_key = 'k6'").to_arrow().column("name").to_pylist()
    assert sorted(names) == ["n6", "n6 (corrected)"]  # the original and the re-sent, once each
    (release,) = [s for s in table.snapshots() if RELEASED in snapshot_properties(s)]
    assert snapshot_properties(release)[RELEASED] == "2"  # who and why too, in the history


def test_tasks_get_the_table_metadata_without_the_uncopied_records(
    catalog_resource: IcebergCatalogResource,
) -> None:
    """The guard's record list can be megabytes (``bench/run.py --suite late-copies``); every
    task would parse it. Tasks get their partition's share in ``TaskSpec.guard`` instead."""
    spec = make_spec("orders", "lc_task_metadata")
    table = load_or_create_table(catalog_resource.load_catalog(), spec)
    with table.transaction() as transaction:
        transaction.set_properties({UNCOPIED_PREFIX + "g": "[" + "1," * 1000 + "1]", "x": "y"})
    sent = orjson.loads(task_metadata_json(table))  # with or without replicas in the spec now
    assert UNCOPIED_PREFIX + "g" in table.properties
    assert UNCOPIED_PREFIX + "g" not in sent["properties"]
    assert sent["properties"]["x"] == "y"
    assert sent["current-schema-id"] == table.metadata.current_schema_id
