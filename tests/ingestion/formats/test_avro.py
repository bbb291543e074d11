"""Avro values in the Confluent wire format, end to end (R34, R35, R36 for Avro).

The end-to-end test runs against a real Schema Registry (the session's ``schema_registry``,
tests/support/registry.py), as a user's deployment does: producers serialize with
confluent-kafka's ``AvroSerializer`` against it, the pipeline spec's ``schema_registry_url`` is
its URL, and the run resolves the writer schemas (and derives the table) through it. Only the
outage test uses a stand-in.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from ingestion.formats.avro import fetch_schemas_by_id
from tests.support.ledger import Ledger, LedgerProducer, Record
from tests.support.pipelines import CreateTopic, Harness, make_spec
from tests.support.registry import EmbeddedSchemaRegistry, make_registry

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
    harness: Harness,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
    schema_registry: EmbeddedSchemaRegistry,
) -> None:
    topic = create_topic(partitions=2)  # a fresh topic: the subject {topic}-value is the test's
    spec = make_spec(
        topic,
        "avro",
        value_format="avro",
        schema=None,
        schema_registry_url=schema_registry.url,
        errors_tolerance="all",
    )
    # The producers' client; each run builds its own from the spec's URL (and closes it).
    with SchemaRegistryClient({"url": schema_registry.url}) as registry:
        first = serialize(registry, V1, topic, [order(i) for i in range(30)])  # registers V1
        ledger_producer.produce(topic, [(f"k{i}".encode(), v, None) for i, v in enumerate(first)])
        report = harness.run(spec)
        assert report.records == 30
        table = harness.table(spec)
        assert str(table.schema().find_field("amount").field_type) == "decimal(12, 2)"
        row = table.scan(row_filter="id = 7").to_arrow().to_pylist()[0]
        assert row["amount"] == Decimal("7.99")
        created = datetime(2026, 11, 22, 10, 0, 0, 123000, UTC)
        assert row["created_at"].replace(tzinfo=UTC) == created

        second = serialize(registry, V2, topic, [order(i, coupon="X") for i in range(30, 40)])
        assert registry.get_versions(f"{topic}-value") == [1, 2]
        unknown_id = b"\x00" + struct.pack(">I", 4242) + b"\x02"  # no such id in the registry
        bad: list[Record] = [(b"magic", b"\x07not-avro", 0), (b"unknown", unknown_id, 1)]
        ledger_producer.produce(
            topic, [*[(f"k{i}".encode(), v, None) for i, v in enumerate(second)], *bad]
        )
        report = harness.run(spec)
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
    """A registry client that is down for its first ``outages`` calls, then answers as
    confluent-kafka's in-memory client holding one schema (unit level, R34).

    A stand-in, not the real registry: a real server cannot be made to fail its first N calls
    and then recover (see ``make_registry``). Past the outage, an unknown id gets the client's
    own ``SchemaRegistryError`` (HTTP 404).
    """

    def __init__(self, outages: int) -> None:
        self.calls = 0
        self.outages = outages
        self.registry = make_registry()
        self.known = self.registry.register_schema("outage-value", Schema('"string"', "AVRO"))

    def get_schema(self, schema_id: int) -> Any:
        self.calls += 1
        if self.calls <= self.outages:
            raise ConnectionError("registry unavailable")
        return self.registry.get_schema(schema_id)


def test_registry_outage_is_retried_then_fails() -> None:
    flaky = FlakyRegistry(outages=2)
    found, missing = fetch_schemas_by_id(flaky, {flaky.known, 404}, wait_s=0.01)
    assert found == {flaky.known: '"string"'}
    assert missing == {404}
    with pytest.raises(ConnectionError):
        fetch_schemas_by_id(FlakyRegistry(outages=10), {1}, attempts=3, wait_s=0.01)
