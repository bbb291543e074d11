"""Nested types, pure: the type-string parser, the Iceberg and Arrow conversions, and the
vectorised JSON decode of struct/list/map columns (bad nested values rejected alone)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField

from ingestion.exceptions import PipelineSpecError
from ingestion.formats.decode import decode_json
from ingestion.spec.pipeline import parse_pipeline_spec
from ingestion.spec.types import TypeStringError, format_type, parse_type_string
from ingestion.table.schema import build_schema, parse_type


@pytest.mark.parametrize(
    ("text", "canonical", "iceberg"),
    [
        ("long", "long", "long"),
        ("decimal(12, 2)", "decimal(12,2)", "decimal(12, 2)"),
        ("struct<id:long,name:string>", "struct<id:long, name:string>", None),
        ("list<struct<sku:string,qty:int>>", "list<struct<sku:string, qty:int>>", None),
        ("map<string,long>", "map<string, long>", "map<string, long>"),
        ("MAP<STRING, LIST<DOUBLE NOT NULL>>", "map<string, list<double not null>>", None),
        (
            "struct<a:struct<b:map<string,struct<c:date not null>>>, d:list<list<int>>>",
            "struct<a:struct<b:map<string, struct<c:date not null>>>, d:list<list<int>>>",
            None,
        ),
        ("list<string not null>", "list<string not null>", "list<string>"),
    ],
)
def test_type_strings_parse_to_canonical_and_iceberg(
    text: str, canonical: str, iceberg: str | None
) -> None:
    node = parse_type_string(text)
    assert format_type(node) == canonical
    assert format_type(parse_type_string(canonical)) == canonical  # stable
    kind = parse_type(text.lower(), itertools.count(100))
    if iceberg is not None:
        assert str(kind) == iceberg


@pytest.mark.parametrize(
    ("text", "position", "expected"),
    [
        ("struct<id:long", 14, "'>'"),
        ("struct<id long>", 10, "':'"),
        ("list<>", 5, "a type"),
        ("map<string>", 10, "','"),
        ("struct<1a:long>", 7, "a field name"),
        ("long long", 5, "end of type"),
        ("lst<int>", 0, "a type"),
        ("struct<id:long not>", 18, "'null'"),
    ],
)
def test_type_string_errors_name_the_position(text: str, position: int, expected: str) -> None:
    with pytest.raises(TypeStringError) as error:
        parse_type_string(text)
    assert f"at position {position} of {text!r}: expected {expected}" in str(error.value)


@pytest.mark.parametrize("text", ["decimal(39,2)", "decimal(5,6)", "struct<a:int, a:long>"])
def test_type_strings_out_of_range_are_rejected(text: str) -> None:
    with pytest.raises(TypeStringError):
        parse_type_string(text)


def test_a_bad_nested_type_names_the_pipeline_and_the_field() -> None:
    raw = {
        "name": "orders",
        "topic": "t",
        "table": "a.b",
        "consumer_group_id": "g",
        "schema": [{"name": "id", "type": "long"}, {"name": "c", "type": "struct<id:lng>"}],
    }
    with pytest.raises(PipelineSpecError) as error:
        parse_pipeline_spec(raw)
    message = str(error.value)
    assert "pipeline 'orders'" in message
    assert "schema.1.type" in message
    assert "at position 10 of 'struct<id:lng>'" in message


def test_nested_field_ids_are_fresh_and_unique() -> None:
    spec = parse_pipeline_spec(
        {
            "name": "n",
            "topic": "t",
            "table": "a.b",
            "consumer_group_id": "g",
            "headers": True,
            "key_format": "json",
            "key_schema": [{"name": "k", "type": "struct<x:int>"}],
            "schema": [
                {"name": "c", "type": "struct<id:long not null, tags:list<string>>"},
                {"name": "m", "type": "map<string, struct<a:int>>"},
            ],
        }
    )
    schema = build_schema(spec)
    ids = [field.field_id for field in schema._lazy_id_to_field.values()]
    assert len(ids) == len(set(ids))
    assert schema.find_field("c.id").required
    assert str(schema.find_field("_kafka_headers").field_type).startswith("list<struct<")
    assert str(schema.find_field("_kafka_key.k.x").field_type) == "int"


def arrow_schema(**columns: str) -> pa.Schema:
    ids = itertools.count(100)
    fields = [
        NestedField(i, name, parse_type(kind, ids), required=False)
        for i, (name, kind) in enumerate(columns.items(), start=1)
    ]
    return schema_to_pyarrow(Schema(*fields))


def decode(schema: pa.Schema, documents: list[Any]) -> tuple[list[dict[str, Any]], list[int]]:
    out = decode_json([orjson.dumps(d) for d in documents], schema)
    return out.table.to_pylist(), [r.index for r in out.rejections]


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("struct<id:long, name:string>", {"id": 1, "name": "a"}, {"id": 1, "name": "a"}),
        ("struct<id:long, name:string>", {"id": 1}, {"id": 1, "name": None}),
        ("list<struct<sku:string, qty:int>>", [{"sku": "x", "qty": 2}], [{"sku": "x", "qty": 2}]),
        ("list<long>", [], []),
        ("map<string, long>", {"a": 1, "b": 2}, [("a", 1), ("b", 2)]),
        ("map<string, long>", {}, []),
        ("map<string, list<int>>", {"a": [1, 2]}, [("a", [1, 2])]),
        ("map<string, struct<v:double>>", {"k": {"v": 1.5}}, [("k", {"v": 1.5})]),
        ("struct<d:date, t:list<time>>", {"d": "2026-11-23", "t": ["10:00:00"]}, None),
        ("struct<m:map<string, string>>", {"m": {"x": "y"}}, {"m": [("x", "y")]}),
    ],
)
def test_nested_values_decode_vectorised(kind: str, value: Any, expected: Any) -> None:
    rows, bad = decode(arrow_schema(c=kind), [{"c": value}, {"c": None}, {}])
    assert bad == []
    if expected is not None:
        assert [row["c"] for row in rows] == [expected, None, None]
    else:
        assert str(rows[0]["c"]["d"]) == "2026-11-23"
        assert str(rows[0]["c"]["t"][0]) == "10:00:00"


@pytest.mark.parametrize(
    ("kind", "bad_value"),
    [
        ("struct<id:long, name:string>", {"id": "x"}),
        ("struct<id:long not null, name:string>", {"name": "no id"}),
        ("list<long not null>", [1, None]),
        ("list<struct<qty:int>>", [{"qty": "many"}]),
        ("map<string, long>", {"a": "x"}),
        ("map<string, long>", [1]),
        ("map<string, struct<v:int>>", {"k": {"v": 1, "surprise": 2}}),
        ("struct<d:date>", {"d": "not a date"}),
    ],
)
def test_a_bad_nested_value_rejects_only_its_record(kind: str, bad_value: Any) -> None:
    schema = arrow_schema(id=parse_type_string("long").kind, c=kind)
    good = [{"id": i, "c": None} for i in range(200)]
    documents = [*good[:100], {"id": -1, "c": bad_value}, *good[100:]]
    out = decode_json([orjson.dumps(d) for d in documents], schema)
    assert [r.index for r in out.rejections] == [100]
    assert out.table.column("id").to_pylist() == list(range(200))
    assert out.stats.single_parses <= 2  # isolated by bisection, not record by record


def test_nested_new_fields_and_promotions_are_reported() -> None:
    schema = arrow_schema(c="struct<id:long>", items="list<struct<qty:int>>")
    out = decode_json(
        [
            orjson.dumps({"c": {"id": 1, "tier": "gold"}}),
            orjson.dumps({"items": [{"qty": 2**40}]}),
            orjson.dumps({"c": {"id": 2, "unknown": None}}),
        ],
        schema,
    )
    assert str(out.new_fields["c"]) == "struct<id: int64, tier: string>"
    assert out.promotions == {"items.element.qty": pa.int64()}
