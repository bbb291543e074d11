"""Avro values in the Confluent wire format, end to end (R34, R35, R36 for Avro)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from ingestion.formats.avro import fetch_schemas_by_id
from tests.support.ledger import Ledger, LedgerProducer, Record
from tests.support.pipelines import CreateTopic, Harness, make_spec
from tests.support.registry import make_registry

V1 = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        },
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
V2 = {
    **V1,
    "fields": [*V1["fields"], {"name": "coupon", "type": ["null", "string"], "default": None}],
}


def serialize(
    registry: Any, schema: dict[str, Any], topic: str, rows: list[dict[str, Any]]
) -> list[bytes]:
    serializer = AvroSerializer(registry, orjson.dumps(schema).decode())
    context = SerializationContext(topic, MessageField.VALUE)
    return [serializer(row, context) for row in rows]


def order(i: int, **extra: Any) -> dict[str, Any]:
    created = datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=UTC)
    return {"id": i, "amount": Decimal(f"{i}.99"), "created_at": created, "note": None, **extra}


@pytest.mark.integration
def test_avro_pipeline_derives_schema_evolves_and_quarantines(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    topic = create_topic(partitions=2)
    registry = make_registry()
    registry.register_schema(f"{topic}-value", Schema(orjson.dumps(V1).decode(), "AVRO"))
    spec = make_spec(
        topic,
        "avro",
        value_format="avro",
        schema=None,
        schema_registry_url="http://unused",
        errors_tolerance="all",
    )
    first = serialize(registry, V1, topic, [order(i) for i in range(30)])
    ledger_producer.produce(topic, [(f"k{i}".encode(), v, None) for i, v in enumerate(first)])
    report = harness.run(spec, registry=registry)
    assert report.records == 30
    table = harness.table(spec)
    assert str(table.schema().find_field("amount").field_type) == "decimal(12, 2)"
    row = table.scan(row_filter="id = 7").to_arrow().to_pylist()[0]
    assert row["amount"] == Decimal("7.99")
    assert row["created_at"].replace(tzinfo=UTC) == datetime(2026, 11, 22, 10, 0, 0, 123000, UTC)

    second = serialize(registry, V2, topic, [order(i, coupon="X") for i in range(30, 40)])
    unknown_id = b"\x00" + struct.pack(">I", 4242) + b"\x02"
    bad: list[Record] = [(b"magic", b"\x07not-avro", 0), (b"unknown", unknown_id, 1)]
    ledger_producer.produce(
        topic, [*[(f"k{i}".encode(), v, None) for i, v in enumerate(second)], *bad]
    )
    report = harness.run(spec, registry=registry)
    assert report.records == 10
    assert report.quarantined == 2
    assert any("coupon" in change for change in report.schema_changes)
    result = harness.assert_exactly_once(spec, ledger)
    assert result.rows == 40
    quarantine = harness.catalog.load_table(spec.quarantine_table).scan().to_arrow()
    assert sorted(quarantine.column("error_class").to_pylist()) == [
        "BadMagicByte",
        "UnknownSchemaId",
    ]


class FlakyRegistry:
    """A registry client that is down for its first ``outages`` calls (unit level, R34)."""

    def __init__(self, outages: int) -> None:
        self.calls = 0
        self.outages = outages

    def get_schema(self, schema_id: int) -> Any:
        self.calls += 1
        if self.calls <= self.outages:
            raise ConnectionError("registry unavailable")
        if schema_id == 404:
            error = RuntimeError("not found")
            error.http_status_code = 404  # type: ignore[attr-defined]
            raise error
        return Schema('"string"', "AVRO")


def test_registry_outage_is_retried_then_fails() -> None:
    found, missing = fetch_schemas_by_id(FlakyRegistry(outages=2), {1, 404}, wait_s=0.01)
    assert found == {1: '"string"'}
    assert missing == {404}
    with pytest.raises(ConnectionError):
        fetch_schemas_by_id(FlakyRegistry(outages=10), {1}, attempts=3, wait_s=0.01)
