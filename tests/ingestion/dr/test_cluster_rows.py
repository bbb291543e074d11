"""Rows record the cluster they were read on (``_kafka_cluster``, docs/cluster-column.md).

A table created before the column gains it on its first run, as a metadata-only schema change
after its other Kafka columns; its older rows read null, which every reader takes for
``primary``, and both audits pass over old and new rows alike. Real broker, real SQL catalog,
real engine runs; the old table is written as the engine wrote it before the column (its schema,
its rows, its commit's offsets).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
from decimal import Decimal

import orjson
import pyarrow as pa
import pytest
from confluent_kafka import TopicCollection
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from ingestion.audit.clusters import allowed_copies
from ingestion.audit.oracle import audit_pipeline, audit_table
from ingestion.dr.cluster_rows import labelled_cluster
from ingestion.exceptions import OperationRefusedError, RouteClusterError
from ingestion.ops.reset import OffsetReset, apply_reset
from ingestion.pipeline.run import run_pipeline
from ingestion.table.offsets import FAILOVER_TO, RESET_BY, TopicOffsets, commit_properties
from ingestion.table.route import PRIMARY, ROUTE
from ingestion.table.schema import (
    CLUSTER_COLUMN,
    TABLE_PROPERTIES,
    build_quarantine_schema,
    build_schema,
    load_or_create_table,
)
from platform_assets.cli.main import main
from platform_assets.ingest.checks import audit_finding
from platform_assets.route import active_route
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.brokers import resume_broker
from tests.support.failback_stack import StackFactory, expire_all, wait_checkpointed
from tests.support.failover_stream import oracle, produce
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import NewPipeline, make_spec, records

NAME = "dr_identity"


def without_cluster(schema: Schema) -> Schema:
    """The schema as the engine built it before ``_kafka_cluster``."""
    return Schema(*(f for f in schema.fields if f.name != CLUSTER_COLUMN))


def test_new_tables_have_the_column_after_the_other_kafka_columns() -> None:
    spec = make_spec("orders", "cl_schema", headers=True)
    names = [f.name for f in build_schema(spec).fields]
    assert names[-3:] == ["_kafka_key", "_kafka_headers", CLUSTER_COLUMN]
    quarantine = [f.name for f in build_quarantine_schema(spec).fields]
    assert quarantine[quarantine.index("_kafka_key") + 1] == CLUSTER_COLUMN
    assert not build_schema(spec).find_field(CLUSTER_COLUMN).required


def orders_row(offset: int, cluster: str | None) -> dict[str, object]:
    """A row of ``orders[0]`` at ``offset`` read on ``cluster`` (None: before the column)."""
    at = dt.datetime(2026, 11, 23, 10, tzinfo=dt.UTC)
    return {
        "id": offset,
        "name": None,
        "amount": None,
        "ts": at,
        "_kafka_topic": "orders",
        "_kafka_partition": 0,
        "_kafka_offset": offset,
        "_kafka_timestamp": at,
        "_kafka_key": f"k{offset}",
        CLUSTER_COLUMN: cluster,
    }


PRIMARY_ROWS = [orders_row(o, None) for o in range(40, 60)]  # before the column: null
LABELLED_PRIMARY = [orders_row(o, "primary") for o in range(40, 60)]


@pytest.mark.parametrize(
    ("rows", "replica_topic", "expected"),
    [
        # dr's rows record it; the primary's read null (older) or primary: told apart.
        (PRIMARY_ROWS + [orders_row(o, "dr") for o in range(50, 62)], "orders", ("dr", {})),
        (LABELLED_PRIMARY + [orders_row(o, "dr") for o in range(50, 62)], "orders", ("dr", {})),
        # dr's rows were written before the column: two nulls at 50..59, one past 60.
        (
            PRIMARY_ROWS + [orders_row(o, None) for o in range(50, 62)],
            "orders",
            (None, {("orders", 0): list(range(50, 62))}),
        ),
        # the column came while the table read dr: its first rows pass for the primary's.
        (
            LABELLED_PRIMARY
            + [orders_row(o, None) for o in range(50, 54)]
            + [orders_row(o, "dr") for o in range(54, 62)],
            "orders",
            (None, {("orders", 0): [50, 51, 52, 53]}),
        ),
        # default naming: the names tell the clusters apart, no filter is needed.
        (PRIMARY_ROWS, "primary.orders", (None, {})),
    ],
    ids=["labelled", "labelled-primary", "dr-before-column", "dr-partly-before", "default"],
)
def test_a_failback_trusts_the_cluster_only_where_rows_record_it(
    catalog_resource: IcebergCatalogResource,
    rows: list[dict[str, object]],
    replica_topic: str,
    expected: tuple[str | None, dict[tuple[str, int], list[int]]],
    request: pytest.FixtureRequest,
) -> None:
    """The table read orders[0] on the primary below 60 and on dr (identity naming) from 50."""
    name = "cl_labels_" + request.node.callspec.id.replace("-", "_")
    table = load_or_create_table(catalog_resource.load_catalog(), make_spec("orders", name))
    table.append(pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema())))
    plans = [
        {
            "source_topic": "orders",
            "partition": 0,
            "replica_topic": replica_topic,
            "replica_start": 50,
            "source_next": 60,
        }
    ]
    assert labelled_cluster([table], plans, "dr") == expected


OVERLAP = [("orders", 0, o) for o in range(50, 60)]  # read on both clusters


@pytest.mark.parametrize(
    ("primary", "dr", "before", "after"),
    [
        # Labelled rows: one per cluster is no duplicate, before and after expiry.
        (LABELLED_PRIMARY, [orders_row(o, "dr") for o in range(50, 62)], [], []),
        (
            LABELLED_PRIMARY,
            [orders_row(o, "dr") for o in [*range(50, 62), 55]],
            [("orders", 0, 55)],
            [("orders", 0, 55)],
        ),
        # A null row: the allowance, read from the unexpired lineage, decides.
        (PRIMARY_ROWS, [orders_row(o, "dr") for o in range(50, 62)], [], OVERLAP),
        (PRIMARY_ROWS, [orders_row(o, None) for o in range(50, 62)], [], OVERLAP),
        (
            PRIMARY_ROWS,
            [orders_row(o, "dr") for o in [*range(50, 62), 55, 45]],
            [("orders", 0, 45), ("orders", 0, 55)],
            [("orders", 0, 45), *OVERLAP],
        ),
        (
            PRIMARY_ROWS,
            [orders_row(o, "dr") for o in range(50, 56)]
            + [orders_row(o, None) for o in range(56, 62)],
            [],
            OVERLAP,
        ),
    ],
    ids=[
        "labelled",
        "labelled-twice",
        "null-and-dr",
        "null-twice",
        "triple-and-outside",
        "partly-labelled",
    ],
)
def test_the_full_audit_counts_labelled_rows_by_cluster_and_null_rows_by_the_allowance(
    catalog_resource: IcebergCatalogResource,
    primary: list[dict[str, object]],
    dr: list[dict[str, object]],
    before: list[tuple[str, int, int]],
    after: list[tuple[str, int, int]],
    request: pytest.FixtureRequest,
) -> None:
    """orders[0] read on the primary to 60, then on dr from 50 (identity naming), as the
    engine commits it; the full audit before and after expiry removed the primary's commit."""
    name = "cl_count_" + request.node.callspec.id.replace("-", "_")
    spec = make_spec("orders", name)
    table = load_or_create_table(catalog_resource.load_catalog(), spec)
    arrow = schema_to_pyarrow(table.schema())
    group = spec.consumer_group_id

    def commit(rows: list[dict[str, object]], cluster: str, to: int, **extra: str) -> None:
        properties = commit_properties(
            group_id=group,
            offsets={"orders": TopicOffsets(cluster, {0: to})},
            commit_id=f"c{len(table.metadata.snapshots)}",
            cluster_id=cluster,
            pipeline=spec.name,
            records=len(rows),
        )
        table.append(pa.Table.from_pylist(rows, schema=arrow), {**properties, **extra})

    commit(primary, "primary", 60)
    commit([], "dr", 50, **{RESET_BY: "ops", FAILOVER_TO: "dr"})  # the failover
    commit(dr, "dr", 62, **{ROUTE: orjson.dumps({FAILOVER_TO: "dr"}).decode()})
    # A reset deletes the primary's rows: refused on dr's route, also called directly.
    reset = OffsetReset(spec.name, group, str(table.metadata.table_uuid), None, {})
    with pytest.raises(OperationRefusedError, match="reads cluster 'dr' since a failover"):
        apply_reset(catalog_resource.load_catalog(), spec, reset, "dr", "ops", "rewind")
    commit([], "primary", 60, **{RESET_BY: "ops", FAILOVER_TO: PRIMARY})  # the failback
    assert audit_table(table, group).duplicates == before
    # dr's rows at 60, 61 hold dr's offsets: past the primary's 60, yet not beyond its
    # watermark; a row written before the column (null) is held to it, as before.
    held = [("orders", 0, r["_kafka_offset"]) for r in dr if r[CLUSTER_COLUMN] is None]
    held = sorted({c for c in held if int(str(c[2])) >= 60})
    assert audit_table(table, group).beyond_watermark == held
    # Expiry keeps the failback and the dr commit it replaced: the primary's range is gone.
    assert expire_all(table, group) == 2
    assert audit_table(table.refresh(), group).duplicates == after


@pytest.mark.integration
def test_a_table_created_before_the_column_gains_it_and_old_rows_audit_as_primary(
    new_pipeline: NewPipeline,
    kafka: KafkaResource,
    catalog_resource: IcebergCatalogResource,
    ledger: Ledger,
    ledger_producer: LedgerProducer,
) -> None:
    topic, spec = new_pipeline(
        "cl_upgrade", produce=5, errors_tolerance="all", in_process_max_records=10_000
    )
    catalog = catalog_resource.load_catalog()
    catalog.create_namespace_if_not_exists("tests")
    table = catalog.create_table(
        spec.table, schema=without_cluster(build_schema(spec)), properties=TABLE_PROPERTIES
    )
    quarantine = catalog.create_table(
        spec.quarantine_table,
        schema=without_cluster(build_quarantine_schema(spec)),
        properties=TABLE_PROPERTIES,
    )
    # The old engine's first commit: rows without the column, and the offsets they reach.
    admin = kafka.get_admin_client()
    topic_id = str(admin.describe_topics(TopicCollection([topic]))[topic].result(10).topic_id)
    old = []
    for entry in sorted(ledger.entries, key=lambda e: e.offset):
        value = orjson.loads(entry.value or b"{}")
        old.append(
            {
                "id": value["id"],
                "name": value["name"],
                "amount": Decimal(value["amount"]),
                "ts": dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC),
                "_kafka_topic": topic,
                "_kafka_partition": 0,
                "_kafka_offset": entry.offset,
                "_kafka_timestamp": dt.datetime.fromtimestamp(entry.timestamp_ms / 1000, dt.UTC),
                "_kafka_key": (entry.key or b"").decode(),
            }
        )
    properties = commit_properties(
        group_id=spec.consumer_group_id,
        offsets={topic: TopicOffsets(topic_id, {0: 5})},
        commit_id="old-engine",
        cluster_id=kafka.get_cluster_id(),
        pipeline=spec.name,
        records=5,
        range_starts={(topic, 0): 0},
    )
    table.append(
        pa.Table.from_pylist(old, schema=schema_to_pyarrow(table.schema())),
        snapshot_properties=properties,
    )
    before = quarantine.metadata.current_schema_id, table.metadata.current_snapshot_id

    ledger_producer.produce(topic, [*records(3, first=5), (b"bad", b"not json", None)])
    report = run_pipeline(spec, kafka.client_config(), catalog, None, kafka.get_cluster_id())
    assert (report.records, report.quarantined) == (3, 1)

    table = catalog.load_table(spec.table)
    names = [f.name for f in table.schema().fields]
    assert names[names.index("_kafka_key") + 1] == CLUSTER_COLUMN  # after the Kafka columns
    rows = table.scan(selected_fields=("_kafka_offset", CLUSTER_COLUMN)).to_arrow()
    by_offset = dict(
        zip(
            rows.column("_kafka_offset").to_pylist(),
            rows.column(CLUSTER_COLUMN).to_pylist(),
            strict=True,
        )
    )
    assert by_offset == {
        0: None,
        1: None,
        2: None,
        3: None,
        4: None,
        5: "primary",
        6: "primary",
        7: "primary",
    }
    quarantine = catalog.load_table(spec.quarantine_table)
    assert quarantine.metadata.current_schema_id != before[0]  # it gained the column too
    dead = quarantine.scan(selected_fields=("_kafka_offset", CLUSTER_COLUMN)).to_arrow()
    assert dead.to_pylist() == [{"_kafka_offset": 8, CLUSTER_COLUMN: "primary"}]
    # Adding the column rewrote no file and made no snapshot: the old commit is the parent.
    head = table.current_snapshot()
    assert head is not None
    assert head.parent_snapshot_id == before[1]

    audit = audit_pipeline(spec, catalog, kafka.client_config(), full=True)
    assert audit is not None
    assert audit.full is not None
    assert audit.commits.ok, audit.commits.findings  # each commit recounted in Kafka
    assert len(audit.commits.recounted) == 2  # the old engine's commit and the new run's
    assert audit.full.ok, audit.full.summary()  # every row's coordinates, old ones too
    assert (audit.full.rows, audit.full.quarantined) == (8, 1)


@pytest.mark.integration
def test_identity_naming_fails_back_after_a_source_lost_failover_with_every_record_once(
    failback_stack: StackFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """MM2 copies ``orders`` to dr's ``orders`` (identity naming); the table ingested 20
    records MM2 never copied, then the primary died: ``--source-lost``, and dr's ``orders`` is
    read from the copies' end, at offsets the table also read on the primary. The rows record
    their cluster, so the failback tells the two apart and lands every record once. Producers
    on dr take its ``orders`` past the primary's position, so after the failback the two
    clusters' rows share coordinates on both sides of the primary's offsets: the full audit
    holds each row to its own cluster, and a rewind after completion (expired lineage)
    deletes the primary's rows only."""
    stack = failback_stack(
        "orders",
        NAME,
        config=True,
        errors_tolerance="all",
        replica={"replication_policy": "identity", "failback_replication_policy": "default"},
        forward={"identity": True, "offset_lag_max": 8},
    )
    source, replica, spec, catalog = stack.source, stack.replica, stack.spec, stack.catalog
    group = stack.group
    assert stack.copy == "orders"

    produce(source.bootstrap_servers, "orders", 0, 100)
    stack.ingest_route()
    with stack.forward_mm2 as forward:  # real MM2: all 100 copied, at the same offsets
        assert forward.wait_mirrored("orders") == 100
        wait_checkpointed(forward, source, group, "orders")  # at the table's position
    produce(source.bootstrap_servers, "orders", 100, 20)  # the RPO tail: never copied...
    stack.ingest_route()  # ...but ingested: the table is at offset 60 of each partition
    os.kill(source.pid or 0, signal.SIGSTOP)  # the disaster
    try:
        assert (
            main(["failover", "--apply", NAME, "--to", "dr", "--source-lost", "--reason", "lost"])
            == 0
        )
        assert "20 record(s) MirrorMaker 2 had not copied" in capsys.readouterr().out
        produce(replica.bootstrap_servers, "orders", 120, 30)  # producers moved to dr's orders
        route = active_route(spec, stack.kafka, stack.iceberg)
        head = catalog.load_table(spec.table).current_snapshot()
        config, cluster_id = route.kafka.client_config(), route.kafka.get_cluster_id()
        # A caller that does not pass the route's cluster would label dr's rows primary.
        with pytest.raises(RouteClusterError, match="told it reads cluster 'primary'"):
            run_pipeline(route.spec, config, catalog, None, cluster_id)
        assert catalog.load_table(spec.table).current_snapshot() == head  # nothing committed
        assert stack.ingest_route() == {"orders"}  # dr's offsets 50.. of each partition
        oracle(catalog, spec, 150)
    finally:
        resume_broker(source)  # the primary is back; MM2's forward flow
        # stays stopped (the --source-lost precondition)
    data = cluster_offsets(catalog.load_table(spec.table), labelled=True)
    dead = cluster_offsets(catalog.load_table(spec.quarantine_table), labelled=True)
    assert set(data) == {"primary", "dr"}  # every row records where it was read
    overlap = (data["primary"] | dead["primary"]) & data["dr"]  # one name, two clusters
    assert overlap == {(p, o) for p in (0, 1) for o in range(50, 60)}
    produce(source.bootstrap_servers, "orders", 150, 6)  # a producer left on the primary
    # MM2's reverse flow, default naming: dr's orders -> the primary's dr.orders.
    with stack.reverse_mm2(identity=False) as reverse:
        reverse.wait_mirrored("orders")
        wait_checkpointed(reverse, replica, group, "orders")

    assert (
        main(["failover", "--apply", NAME, "--to", "primary", "--reason", "primary is back"]) == 0
    )
    out = capsys.readouterr().out
    assert "origin orders[0] (at 60 before the failover) resumes at 60" in out
    assert stack.ingest_route() == {"dr.orders", "orders"}
    oracle(catalog, spec, 156)  # the reverse copy skipped what dr's rows hold; the tail once
    # The primary's orders is at 63, dr's rows of orders reach 64: not beyond the watermark.
    full = audit_finding(spec, stack.iceberg, stack.kafka, full=True)
    assert full.passed, full.message
    produce(source.bootstrap_servers, "orders", 156, 10)  # producers back on the primary
    stack.ingest_route()
    oracle(catalog, spec, 166)
    quarantine = cluster_offsets(catalog.load_table(spec.quarantine_table), labelled=True)
    primary_letters = {(1, 28), (0, 52), (1, 52)}  # k57 k104 k105
    assert quarantine == {"primary": primary_letters, "dr": {(1, 60)}}  # k141, read on dr
    audit = audit_finding(spec, stack.iceberg, stack.kafka)
    assert audit.passed, audit.message
    full = audit_finding(spec, stack.iceberg, stack.kafka, full=True)
    assert full.passed, full.message
    # Expiry (minutes on a stream) removes the commits that read orders on the primary: the
    # lineage no longer says two clusters read 50..59, the rows' labels still do.
    table = catalog.load_table(spec.table)
    assert allowed_copies(table, stack.group)(("orders", 0, 55)) == 2
    assert expire_all(table, stack.group) > 0
    assert allowed_copies(table.refresh(), stack.group)(("orders", 0, 55)) == 1
    full = audit_finding(spec, stack.iceberg, stack.kafka, full=True)
    assert full.passed, full.message  # the allowance alone would report 50..59 twice

    # Completed, expired (the lineage forgets dr), then rewound on the primary: the rewind
    # deletes the primary's rows and dead letters only; dr's, at the same coordinates, stay.
    assert main(["complete-failback", "--apply", NAME, "--reason", "reverse copy drained"]) == 0
    expire_all(catalog.load_table(spec.table), stack.group)
    assert main(["reset", NAME, "--to", "earliest", "--apply", "--reason", "re-read"]) == 0
    quarantine = cluster_offsets(catalog.load_table(spec.quarantine_table), labelled=True)
    assert quarantine == {"dr": {(1, 60)}}
    assert stack.ingest_route() == {"orders"}
    oracle(catalog, spec, 166)
    full = audit_finding(spec, stack.iceberg, stack.kafka, full=True)
    assert full.passed, full.message


def cluster_offsets(table: Table, labelled: bool = False) -> dict[str, set[tuple[int, int]]]:
    """Per ``_kafka_cluster``, the (partition, offset) of the table's ``orders`` rows (null
    read as ``primary``, unless ``labelled``: this table's rows all record it)."""
    rows = table.scan(
        row_filter="_kafka_topic = 'orders'",
        selected_fields=("_kafka_partition", "_kafka_offset", CLUSTER_COLUMN),
    ).to_arrow()
    found: dict[str, set[tuple[int, int]]] = {}
    for row in rows.to_pylist():
        cluster = row[CLUSTER_COLUMN] or ("null" if labelled else "primary")
        found.setdefault(cluster, set()).add((row["_kafka_partition"], row["_kafka_offset"]))
    return found
