"""Nested data end to end: struct/list/map columns from JSON and Avro, nested evolution,
Kafka headers and JSON keys, on the real broker, catalog and Spark; read back by pyiceberg,
DuckDB and dbt; and the conversions of ``ingestion.formats.nested`` on their own (pure Arrow)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from dbt.cli.main import dbtRunner

from ingestion.formats.nested import (
    cast_nested,
    fix_array,
    fix_column,
    needs_fix,
    nested_additions,
    promotion_candidates,
    read_type,
    widen,
)
from ingestion.pipeline.run import run_pipeline
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource
from tests.ingestion.formats.test_avro import serialize
from tests.support.ledger import Ledger, LedgerProducer, Record
from tests.support.pipelines import CreateTopic, Harness, make_spec
from tests.support.registry import EmbeddedSchemaRegistry

NESTED_SCHEMA: list[dict[str, Any]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "customer", "type": "struct<id:long not null, name:string>"},
    {"name": "items", "type": "list<struct<sku:string, qty:int>>"},
    {"name": "attrs", "type": "map<string, long>"},
    {"name": "tags", "type": "list<string>"},
]


def nested_event(i: int) -> dict[str, Any]:
    """A nested order; every 5th has no customer, every 3rd no attributes."""
    return {
        "id": i,
        "customer": None if i % 5 == 0 else {"id": 1000 + i, "name": f"c{i}"},
        "items": [{"sku": f"s{i}-{j}", "qty": j + 1} for j in range(i % 3)],
        "attrs": None if i % 3 == 0 else {"a": i, "b": i * 2},
        "tags": [f"t{i}", "x"],
    }


def normalized(row: dict[str, Any]) -> dict[str, Any]:
    """A row read back as produced: maps (Arrow gives key/value pairs) as dicts."""
    attrs = row["attrs"]
    return {**row, "attrs": None if attrs is None else dict(attrs)}


def read_back(table: Any, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = table.scan(selected_fields=columns).to_arrow().sort_by("id").to_pylist()
    return [normalized(row) for row in rows]


@pytest.mark.integration
def test_nested_json_round_trip_read_by_pyiceberg_and_dbt(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kafka: KafkaResource,
    spark_resource: SparkResource,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
) -> None:
    monkeypatch.setenv("PLATFORM_STATE_DIR", str(tmp_path))
    topic = create_topic(partitions=2)
    events = [nested_event(i) for i in range(40)]
    bad: Record = (b"bad", b'{"id": 99, "customer": {"id": "not a number"}}', 0)
    produced = [(f"k{i}".encode(), orjson.dumps(e), None) for i, e in enumerate(events)]
    ledger_producer.produce(topic, [*produced[:20], bad, *produced[20:]])
    spec = make_spec(topic, "nested_json", schema=NESTED_SCHEMA, errors_tolerance="all")
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    report = run_pipeline(
        spec, kafka.client_config(), catalog, spark_resource.spark_session, kafka.get_cluster_id()
    )
    assert (report.records, report.quarantined) == (40, 1)
    table = catalog.load_table(spec.table)
    schema = table.schema()
    assert schema.find_field("customer.id").required
    assert str(schema.find_field("attrs").field_type) == "map<string, long>"
    assert read_back(table, tuple(NESTED_SCHEMA_NAMES)) == events
    quarantine = catalog.load_table(spec.quarantine_table).scan().to_arrow().to_pylist()
    assert [row["value"] for row in quarantine] == [bad[1]]

    # dbt (DuckDB through the platform's Iceberg plugin) selects nested fields.
    project = write_dbt_project(tmp_path / "dbt", spec.table)
    result = dbtRunner().invoke(
        ["build", "--project-dir", str(project), "--profiles-dir", str(project), "--quiet"]
    )
    assert result.success, result.exception
    with duckdb.connect(str(tmp_path / "analytics.duckdb")) as connection:  # as dbt opened it
        rows = connection.execute(
            "select id, customer_name, first_sku, item_count, attr_b from nested_orders order by id"
        ).fetchall()
    expected = [
        (
            e["id"],
            e["customer"]["name"] if e["customer"] else None,
            e["items"][0]["sku"] if e["items"] else None,
            len(e["items"]),
            e["attrs"]["b"] if e["attrs"] else None,
        )
        for e in events
    ]
    assert rows == expected


NESTED_SCHEMA_NAMES = [field["name"] for field in NESTED_SCHEMA]


def write_dbt_project(path: Path, table: str) -> Path:
    """A one-model dbt project on the nested table, with the platform's embedded profile."""
    namespace, name = table.split(".")
    (path / "models").mkdir(parents=True)
    (path / "dbt_project.yml").write_text(
        "name: nested_check\nversion: '1.0.0'\nconfig-version: 2\nprofile: platform\n"
        "model-paths: [models]\n"
    )
    repo_profiles = Path(__file__).resolve().parents[3] / "dbt" / "profiles.yml"
    (path / "profiles.yml").write_text(repo_profiles.read_text())
    (path / "models" / "sources.yml").write_text(
        f"version: 2\nsources:\n  - name: {namespace}\n    schema: {namespace}\n"
        f"    meta: {{plugin: iceberg}}\n    tables:\n      - name: {name}\n"
    )
    (path / "models" / "nested_orders.sql").write_text(
        "{{ config(materialized='table') }}\n"
        "select id, customer.name as customer_name, items[1].sku as first_sku,\n"
        "       len(items) as item_count, attrs['b'] as attr_b\n"
        f"from {{{{ source('{namespace}', '{name}') }}}}\n"
    )
    return path


@pytest.mark.integration
def test_headers_land_with_repeats_and_binary_values_and_duckdb_reads_them(
    harness: Harness, create_topic: CreateTopic, kafka: KafkaResource
) -> None:
    topic = create_topic(partitions=1)
    headers: list[list[tuple[str, str | bytes | None]] | None] = [
        [("trace", b"t-0"), ("hop", b"a"), ("hop", b"b")],
        None,
        [("bin", b"\x00\xff\x10"), ("empty", None)],
    ]
    producer = Producer(kafka.client_config())
    for i, record_headers in enumerate(headers):
        value = orjson.dumps({"id": i})
        producer.produce(topic, key=f"k{i}".encode(), value=value, headers=record_headers)
        producer.flush(10)
    spec = make_spec(topic, "with_headers", headers=True)
    report = harness.run(spec)
    assert report.records == 3
    table = harness.table(spec)
    rows = table.scan(selected_fields=("id", "_kafka_headers")).to_arrow().sort_by("id")
    landed = [[(h["key"], h["value"]) for h in row["_kafka_headers"]] for row in rows.to_pylist()]
    assert landed == [h or [] for h in headers]
    # Another engine: DuckDB on the Arrow scan, unnesting the list of structs in order.
    frame = table.scan().to_arrow()  # noqa: F841 - read by DuckDB's replacement scan
    relation = duckdb.sql(
        "select id, h.key, h.value from (select id, unnest(_kafka_headers) as h from frame)"
        " where h.key = 'hop' or h.key = 'bin' order by id, h.key, h.value"
    )
    assert relation is not None
    found = relation.fetchall()
    assert found == [(0, "hop", b"a"), (0, "hop", b"b"), (2, "bin", b"\x00\xff\x10")]


@pytest.mark.integration
def test_new_struct_field_and_nested_promotion_mid_stream(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    topic = create_topic(partitions=2)
    spec = make_spec(topic, "nested_evolution", schema=NESTED_SCHEMA)
    first = [nested_event(i) for i in range(10)]
    ledger_producer.produce(topic, [(None, orjson.dumps(e), None) for e in first])
    assert harness.run(spec).records == 10

    second = [nested_event(i) for i in range(10, 20)]
    for event in second:
        event["customer"] = {"id": event["id"], "name": "n", "tier": "gold"}  # new field
    second[3]["items"] = [{"sku": "big", "qty": 2**40}]  # does not fit int: promote to long
    ledger_producer.produce(topic, [(None, orjson.dumps(e), None) for e in second])
    report = harness.run(spec)
    assert report.records == 10
    assert any("customer" in change and "tier" in change for change in report.schema_changes)
    assert "promoted items.element.qty to int64" in report.schema_changes
    table = harness.table(spec)
    assert str(table.schema().find_field("items.element.qty").field_type) == "long"
    rows = {row["id"]: row for row in table.scan().to_arrow().to_pylist()}
    assert rows[1]["customer"] == {"id": 1001, "name": "c1", "tier": None}
    assert rows[12]["customer"] == {"id": 12, "name": "n", "tier": "gold"}
    assert rows[13]["items"] == [{"sku": "big", "qty": 2**40}]
    harness.assert_exactly_once(spec, ledger)


@pytest.mark.integration
def test_json_keys_land_as_a_struct_and_bad_keys_are_quarantined(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer
) -> None:
    topic = create_topic(partitions=1)
    key_schema = [
        {"name": "order", "type": "long", "required": True},
        {"name": "region", "type": "string"},
    ]
    spec = make_spec(
        topic, "json_keys", key_format="json", key_schema=key_schema, errors_tolerance="all"
    )
    keys = [b'{"order": 1, "region": "eu"}', None, b'{"region": "us"}', b"not json"]
    values = [orjson.dumps({"id": i}) for i in range(len(keys))]
    ledger_producer.produce(topic, [(k, v, 0) for k, v in zip(keys, values, strict=True)])
    report = harness.run(spec)
    assert (report.records, report.quarantined) == (2, 2)
    rows = harness.table(spec).scan().to_arrow().sort_by("id").to_pylist()
    assert [(r["id"], r["_kafka_key"]) for r in rows] == [
        (0, {"order": 1, "region": "eu"}),
        (1, None),
    ]
    quarantine = harness.catalog.load_table(spec.quarantine_table).scan().to_arrow()
    assert sorted(quarantine.column("_kafka_key").to_pylist()) == [b"not json", b'{"region": "us"}']


AVRO_NESTED = {
    "type": "record",
    "name": "NestedOrder",
    "fields": [
        {"name": "id", "type": "long"},
        {
            "name": "customer",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Customer",
                    "fields": [
                        {"name": "id", "type": "long"},
                        {"name": "name", "type": ["null", "string"], "default": None},
                    ],
                },
            ],
            "default": None,
        },
        {
            "name": "items",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Item",
                    "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}],
                },
            },
        },
        {"name": "attrs", "type": ["null", {"type": "map", "values": "long"}], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


@pytest.mark.integration
def test_nested_avro_round_trip(
    harness: Harness,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
    schema_registry: EmbeddedSchemaRegistry,
) -> None:
    """Through the real Schema Registry: the producer's serializer registers the schema under
    the test's own subject ({topic}-value); the run resolves it at the spec's URL with a
    client of its own."""
    topic = create_topic(partitions=2)
    events = [nested_event(i) for i in range(30)]
    spec = make_spec(
        topic,
        "nested_avro",
        value_format="avro",
        schema=None,
        schema_registry_url=schema_registry.url,
    )
    with SchemaRegistryClient({"url": schema_registry.url}) as registry:
        values = serialize(registry, AVRO_NESTED, topic, events)
        ledger_producer.produce(topic, [(f"k{i}".encode(), v, None) for i, v in enumerate(values)])
        assert harness.run(spec).records == 30
    table = harness.table(spec)
    assert str(table.schema().find_field("attrs").field_type).startswith("map<")
    assert read_back(table, tuple(NESTED_SCHEMA_NAMES)) == events
    harness.assert_exactly_once(spec, ledger)


# The conversions on their own: what pyarrow.json reads and how it becomes the table's type.

MAP_OF_STRUCTS = pa.map_(pa.string(), pa.struct([("a", pa.int64())]))


@pytest.mark.parametrize(
    ("kind", "read"),
    [
        (pa.int64(), pa.int64()),
        (pa.date32(), pa.string()),
        (pa.time64("us"), pa.string()),
        (pa.map_(pa.string(), pa.int64()), pa.struct([])),
        (pa.large_list(pa.int64()), pa.list_(pa.field("item", pa.int64()))),
        (pa.struct([pa.field("id", pa.int64(), nullable=False)]), pa.struct([("id", pa.int64())])),
    ],
    ids=["plain", "date", "time", "map", "large-list", "required-child"],
)
def test_the_type_read_for_each_column_type(kind: pa.DataType, read: pa.DataType) -> None:
    """Maps as inferred structs, dates and times as text, large lists as lists, nested required
    fields as optional; a plain type as itself (no fix needed)."""
    assert read_type(kind) == read
    assert needs_fix(kind) is (read != kind)


def test_a_json_object_becomes_map_entries_and_a_null_value_an_absent_key() -> None:
    read = pa.array([{"x": {"a": 1}, "y": None}, None, {"x": None, "y": {"a": 2}}])
    assert fix_array(read, MAP_OF_STRUCTS).to_pylist() == [
        [("x", {"a": 1})],
        None,
        [("y", {"a": 2})],
    ]


def test_a_map_value_with_a_field_its_type_lacks_is_refused() -> None:
    """No evolution inside map values: the record is rejected, not widened."""
    with pytest.raises(pa.ArrowInvalid, match=r"fields \['b'\] are not in"):
        fix_array(pa.array([{"x": {"a": 1, "b": 2}}]), MAP_OF_STRUCTS)


def test_a_required_nested_field_null_under_a_present_parent_is_refused() -> None:
    kind = pa.struct([pa.field("id", pa.int64(), nullable=False)])
    with pytest.raises(pa.ArrowInvalid, match="required nested field 'id'"):
        fix_array(pa.array([{"id": None}]), kind)
    # Under a null parent it is no error.
    assert fix_array(pa.array([{"id": 1}, None]), kind).to_pylist() == [{"id": 1}, None]


def test_struct_fields_not_in_the_schema_are_kept_as_new_nested_fields() -> None:
    fixed = fix_array(pa.array([{"id": 1, "new": "x"}]), pa.struct([("id", pa.int64())]))
    assert fixed.type == pa.struct([("id", pa.int64()), ("new", pa.string())])
    assert fixed.to_pylist() == [{"id": 1, "new": "x"}]


def test_dates_times_and_large_lists_convert_from_what_was_read() -> None:
    dates = fix_column(pa.chunked_array([pa.array(["2026-01-02", None])]), pa.date32())
    assert dates.to_pylist() == [dt.date(2026, 1, 2), None]
    times = fix_column(pa.chunked_array([pa.array(["10:11:12.5"])]), pa.time64("us"))
    assert times.to_pylist() == [dt.time(10, 11, 12, 500000)]
    lists = fix_column(pa.chunked_array([pa.array([[1, 2], None])]), pa.large_list(pa.int64()))
    assert lists.type == pa.large_list(pa.int64())
    assert lists.to_pylist() == [[1, 2], None]


@pytest.mark.parametrize(
    ("read", "kind"),
    [
        (pa.array(["not a date"]), pa.date32()),
        (pa.array([1]), pa.list_(pa.int64())),
        (pa.array([1]), pa.map_(pa.string(), pa.int64())),
        (pa.array([{"a": "x"}]), pa.map_(pa.string(), pa.int64())),
    ],
    ids=["bad-date", "scalar-for-list", "scalar-for-map", "map-value-of-another-type"],
)
def test_a_value_that_does_not_convert_raises_arrow_invalid(
    read: pa.Array, kind: pa.DataType
) -> None:
    """ArrowInvalid, whatever Arrow raised inside: the caller isolates the record by it."""
    with pytest.raises(pa.ArrowInvalid):
        fix_column(pa.chunked_array([read]), kind)


def test_nested_additions_see_new_fields_inside_lists_but_not_maps_or_all_null_ones() -> None:
    declared = pa.list_(pa.struct([("a", pa.int64())]))
    seen = pa.list_(pa.struct([("a", pa.int64()), ("b", pa.string()), ("c", pa.null())]))
    added = nested_additions(declared, seen)
    wider = pa.struct([("a", pa.int64()), ("b", pa.string())])
    assert added == pa.list_(pa.field("element", wider))
    in_map = pa.map_(pa.string(), pa.struct([("a", pa.int64()), ("b", pa.int64())]))
    assert nested_additions(MAP_OF_STRUCTS, in_map) is None
    assert nested_additions(declared, declared) is None


def test_promotions_reach_nested_leaves_and_widen_as_iceberg_allows() -> None:
    schema = pa.schema(
        [
            ("l", pa.list_(pa.int32())),
            ("m", pa.map_(pa.string(), pa.float32())),
            ("d", pa.decimal128(9, 2)),
            ("s", pa.string()),
        ]
    )
    found = {path: (changed, wider) for path, changed, wider in promotion_candidates(schema)}
    assert {path: wider for path, (_, wider) in found.items()} == {
        "l.element": pa.int64(),
        "m.value": pa.float64(),
        "d": pa.decimal128(38, 2),
    }
    assert found["l.element"][0].field("l").type == pa.list_(pa.int64())
    assert found["l.element"][0].field("m").type == schema.field("m").type  # one at a time
    assert widen(pa.decimal128(38, 2)) is None
    assert widen(pa.int64()) is None


def test_cast_nested_keeps_required_children_under_null_parents_writable() -> None:
    """pyarrow's cast refuses a required child holding nulls under null parents; the rebuilt
    column casts, reads the same, and its required child has no null left (Parquet writes it)."""
    kind = pa.struct([pa.field("id", pa.int64(), nullable=False)])
    read = pa.StructArray.from_arrays(
        [pa.array([1, None])], fields=[pa.field("id", pa.int64())], mask=pa.array([False, True])
    )
    cast = cast_nested(pa.chunked_array([read]), kind)
    assert cast.type == kind
    assert cast.to_pylist() == [{"id": 1}, None]
    assert cast.chunk(0).field(0).null_count == 0
