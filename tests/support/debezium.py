"""A Debezium-format producer: a Postgres table's change stream as Debezium's PostgreSQL
connector writes it to Kafka (JsonConverter, schemas enabled by default), built from the
envelope's specification (field names and Connect types as Debezium emits them), and the
ledger of the table's current state that the ingested table must equal.

Stand-in for a real Debezium connector against a real Postgres (the envelope is what the
connector writes; its database side is not exercised). Columns as Debezium maps them with
``decimal.handling.mode=string``: ``id`` int4 -> int32, ``name`` varchar -> string,
``balance`` numeric(10,2) -> string, ``updated_at`` timestamptz -> string
(``io.debezium.time.ZonedTimestamp``, ISO-8601).

A record is ``(key, value, partition)`` as ``tests.support.pipelines.records`` gives them; a
delete is followed by its tombstone (``tombstones.on.delete=true``, Debezium's default).

With a ``registry`` (a Schema Registry client), keys and values are written as Confluent's
AvroConverter writes them: the Connect schemas above mapped to Avro as the converter maps them
(a struct is a record named by its Connect name, an optional field a union with null and default
null, ``int32`` an ``int``, ``int64`` a ``long``, a logical name kept as ``connect.name``), and
registered under ``<topic>-key`` and ``<topic>-value`` (topic name strategy) by confluent-kafka's
AvroSerializer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import orjson

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from ingestion.spec.pipeline import PipelineSpec

Record = tuple[bytes | None, bytes | None, int | None]
VERSION = "3.2.0.Final"  # the Debezium release whose envelope this follows
COLUMNS = (
    ("id", "int32", None, False),
    ("name", "string", None, True),
    ("balance", "string", None, True),
    ("updated_at", "string", "io.debezium.time.ZonedTimestamp", True),
)
SOURCE_FIELDS = (
    ("version", "string", False),
    ("connector", "string", False),
    ("name", "string", False),
    ("ts_ms", "int64", False),
    ("snapshot", "string", True),
    ("db", "string", False),
    ("sequence", "string", True),
    ("ts_us", "int64", True),
    ("ts_ns", "int64", True),
    ("schema", "string", False),
    ("table", "string", False),
    ("txId", "int64", True),
    ("lsn", "int64", True),
    ("xmin", "int64", True),
)


_AVRO_TYPES = {"int32": "int", "int64": "long", "string": "string"}


def avro_schema(connect: dict[str, Any], defined: set[str] | None = None) -> Any:
    """The Avro schema AvroConverter writes for a Connect schema (a struct, or a primitive),
    a record already ``defined`` referred to by name."""
    defined = set() if defined is None else defined
    if connect["type"] == "struct":
        name = connect["name"]
        if name in defined:
            kind: Any = name
        else:
            defined.add(name)
            namespace, _, short = name.rpartition(".")
            fields = []
            for entry in connect["fields"]:
                field_type = avro_schema(entry, defined)
                avro_field: dict[str, Any] = {"name": entry["field"], "type": field_type}
                if entry.get("optional"):
                    avro_field.update(type=["null", field_type], default=None)
                fields.append(avro_field)
            kind = {"type": "record", "name": short, "fields": fields, "connect.name": name}
            if namespace:
                kind["namespace"] = namespace
        return kind
    kind = _AVRO_TYPES[connect["type"]]
    if connect.get("name"):
        return {"type": kind, "connect.version": 1, "connect.name": connect["name"]}
    return kind


FLAT_FIELDS = (  # what ExtractNewRecordState adds (add.fields=op,source.ts_ms,lsn; rewrite)
    {"type": "string", "optional": True, "field": "__op"},
    {"type": "int64", "optional": True, "field": "__source_ts_ms"},
    {"type": "int64", "optional": True, "field": "__lsn"},
    {"type": "string", "optional": True, "field": "__deleted"},
)


def _row_schema(name: str, field_name: str | None, optional: bool) -> dict[str, Any]:
    fields = []
    for column, kind, logical, nullable in COLUMNS:
        entry: dict[str, Any] = {"type": kind, "optional": nullable, "field": column}
        if logical:
            entry.update(name=logical, version=1)
        fields.append(entry)
    schema: dict[str, Any] = {"type": "struct", "fields": fields, "optional": optional}
    schema["name"] = name
    if field_name:
        schema["field"] = field_name
    return schema


@dataclass
class DebeziumTable:
    """One source table (``server.schema.table``) and its change events."""

    server: str = "dbserver1"
    schema: str = "public"
    table: str = "customers"
    schemas_enabled: bool = True
    tombstones: bool = True
    # ExtractNewRecordState (add.fields=op,source.ts_ms,lsn; delete.handling.mode=rewrite): the
    # row with __op, __source_ts_ms, __lsn and __deleted, and no tombstones (dropped by it).
    flattened: bool = False
    partitions: int = 1
    registry: Any | None = None  # a SchemaRegistryClient: Avro keys and values (AvroConverter)
    kafka_topic: str | None = None  # where the records go, when not :attr:`topic` (for subjects)
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # the ledger: current state
    _serializers: dict[str, Any] = field(default_factory=dict)
    _lsn: int = 24_023_128
    _tx: int = 555
    _clock: datetime = field(default_factory=lambda: datetime(2026, 11, 28, tzinfo=UTC))

    @property
    def topic(self) -> str:
        """Debezium's topic name: ``<topic.prefix>.<schema>.<table>``."""
        return f"{self.server}.{self.schema}.{self.table}"

    def _wrap(self, schema: dict[str, Any], payload: Any, key: bool = False) -> bytes:
        if self.registry is not None:
            return self._avro(schema, payload, key)
        return orjson.dumps(
            {"schema": schema, "payload": payload} if self.schemas_enabled else payload
        )

    def _avro(self, schema: dict[str, Any], payload: Any, key: bool) -> bytes:
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        text = orjson.dumps(avro_schema(schema)).decode()
        serializer = self._serializers.get(text)
        if serializer is None:
            serializer = AvroSerializer(self.registry, text, conf={"auto.register.schemas": True})
            self._serializers[text] = serializer
        field_kind = MessageField.KEY if key else MessageField.VALUE
        context = SerializationContext(self.kafka_topic or self.topic, field_kind)
        encoded = serializer(payload, context)
        assert encoded is not None
        return bytes(encoded)

    def key_schema(self) -> dict[str, Any]:
        """The Connect schema of the record key (the primary key)."""
        return {
            "type": "struct",
            "fields": [{"type": "int32", "optional": False, "field": "id"}],
            "optional": False,
            "name": f"{self.topic}.Key",
        }

    def _key(self, key: int) -> bytes:
        return self._wrap(self.key_schema(), {"id": key}, key=True)

    def envelope_schema(self) -> dict[str, Any]:
        """The Connect schema of a change event's value (Debezium's envelope)."""
        value = f"{self.topic}.Value"
        source = {
            "type": "struct",
            "fields": [{"type": t, "optional": o, "field": f} for f, t, o in SOURCE_FIELDS],
            "optional": False,
            "name": "io.debezium.connector.postgresql.Source",
            "field": "source",
        }
        return {
            "type": "struct",
            "fields": [
                _row_schema(value, "before", True),
                _row_schema(value, "after", True),
                source,
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
                {"type": "int64", "optional": True, "field": "ts_us"},
                {"type": "int64", "optional": True, "field": "ts_ns"},
                {
                    "type": "struct",
                    "fields": [
                        {"type": "string", "optional": False, "field": "id"},
                        {"type": "int64", "optional": False, "field": "total_order"},
                        {"type": "int64", "optional": False, "field": "data_collection_order"},
                    ],
                    "optional": True,
                    "name": "event.block",
                    "version": 1,
                    "field": "transaction",
                },
            ],
            "optional": False,
            "name": f"{self.topic}.Envelope",
            "version": 2,
        }

    def _event(
        self,
        op: str,
        key: int,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        snapshot: str = "false",
    ) -> Record:
        self._clock += timedelta(milliseconds=3)
        self._lsn += 56
        if snapshot == "false":
            self._tx += 1
        ts_ms = int(self._clock.timestamp() * 1000)
        source = {
            "version": VERSION,
            "connector": "postgresql",
            "name": self.server,
            "ts_ms": ts_ms,
            "snapshot": snapshot,
            "db": "inventory",
            "sequence": orjson.dumps([str(self._lsn - 56), str(self._lsn)]).decode(),
            "ts_us": ts_ms * 1000,
            "ts_ns": ts_ms * 1_000_000,
            "schema": self.schema,
            "table": self.table,
            "txId": self._tx,
            "lsn": self._lsn,
            "xmin": None,
        }
        if self.flattened:
            row = dict(after if after is not None else before or {})
            row.update(
                __op=op,
                __source_ts_ms=ts_ms,
                __lsn=self._lsn,
                __deleted="true" if op == "d" else "false",
            )
            flat_schema = _row_schema(f"{self.topic}.Value", None, False)
            flat_schema["fields"] = [*flat_schema["fields"], *FLAT_FIELDS]
            return self._key(key), self._wrap(flat_schema, row), self._partition(key)
        payload = {
            "before": before,
            "after": after,
            "source": source,
            "op": op,
            "ts_ms": ts_ms + 1,
            "ts_us": (ts_ms + 1) * 1000,
            "ts_ns": (ts_ms + 1) * 1_000_000,
            "transaction": None,
        }
        return self._key(key), self._wrap(self.envelope_schema(), payload), self._partition(key)

    def _partition(self, key: int) -> int:
        return key % self.partitions  # every change of a key in one partition, as Debezium's

    def _row(self, key: int, name: str, balance: str) -> dict[str, Any]:
        stamp = self._clock.isoformat().replace("+00:00", "Z")
        return {"id": key, "name": name, "balance": balance, "updated_at": stamp}

    def snapshot(self, count: int) -> list[Record]:
        """The initial snapshot of ``count`` new rows: ``op: r``, ``source.snapshot`` ``first``,
        ``true`` .. ``last``."""
        events = []
        for position, key in enumerate(range(len(self.rows), len(self.rows) + count)):
            row = self._row(key, f"name-{key}", f"{key % 997}.{key % 100:02d}")
            self.rows[key] = row
            phase = "first" if position == 0 else "last" if position == count - 1 else "true"
            events.append(self._event("r", key, None, row, snapshot=phase))
        return events

    def insert(self, key: int) -> list[Record]:
        row = self._row(key, f"name-{key}", "0.00")
        self.rows[key] = row
        return [self._event("c", key, None, row)]

    def update(self, key: int, rng: random.Random) -> list[Record]:
        before = self.rows[key]
        after = self._row(key, before["name"], f"{rng.randint(0, 99_999)}.{rng.randint(0, 99):02d}")
        self.rows[key] = after
        return [self._event("u", key, before, after)]

    def delete(self, key: int) -> list[Record]:
        """``op: d`` with the primary key only in ``before`` (Postgres' default replica
        identity), then the tombstone."""
        del self.rows[key]
        events = [
            self._event(
                "d", key, {"id": key, "name": None, "balance": None, "updated_at": None}, None
            )
        ]
        if self.tombstones and not self.flattened:
            events.append((self._key(key), None, self._partition(key)))
        return events

    def random_changes(self, rng: random.Random, count: int, keys: int) -> list[Record]:
        """``count`` changes over ids ``0 .. keys - 1`` with hot keys: a tenth of the keys take
        half of the changes. An absent key is inserted; a present one updated, or deleted one
        time in five."""
        hot = max(1, keys // 10)
        events: list[Record] = []
        for _ in range(count):
            key = rng.randrange(hot) if rng.random() < 0.5 else rng.randrange(keys)
            if key not in self.rows:
                events += self.insert(key)
            elif rng.random() < 0.2:
                events += self.delete(key)
            else:
                events += self.update(key, rng)
        return events


def state_by_duckdb(table: Table) -> dict[int, dict[str, Any]]:
    """The table's rows read by DuckDB from its live data files (no Iceberg reader), by id;
    a key holding two rows fails."""
    import duckdb

    files = [urlparse(t.file.file_path).path for t in table.refresh().scan().plan_files()]
    if not files:
        return {}
    with duckdb.connect() as connection:
        rows = connection.execute(
            "select id, name, cast(balance as varchar), "
            "strftime(updated_at at time zone 'UTC', '%Y-%m-%dT%H:%M:%S.%fZ') "
            "from read_parquet(?)",
            [files],
        ).fetchall()
    ids = [row[0] for row in rows]
    assert len(ids) == len(set(ids)), "a key holds two rows"
    return {
        row[0]: {"id": row[0], "name": row[1], "balance": row[2], "updated_at": row[3]}
        for row in rows
    }


def expected(source: DebeziumTable) -> dict[int, dict[str, Any]]:
    """The ledger's rows as DuckDB prints them (timestamps always with microseconds)."""
    out = {}
    for key, row in source.rows.items():
        stamp = row["updated_at"].removesuffix("Z")
        stamp = stamp if "." in stamp else stamp + ".000000"
        out[key] = {**row, "updated_at": stamp + "Z"}
    return out


def cdc_spec(topic: str, name: str, **overrides: Any) -> PipelineSpec:
    """A ``mode: upsert`` pipeline of this source table's columns on ``topic``, partitioned by
    a bucket of ``name``, which a delete event does not carry (the key alone finds the row)."""
    from ingestion.spec.pipeline import parse_pipeline_spec

    raw: dict[str, Any] = {
        "name": name,
        "topic": topic,
        "table": f"tests.{name}",
        "consumer_group_id": f"group-{name}",
        "mode": "upsert",
        "key_fields": ["id"],
        "schema": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": "string"},
            {"name": "balance", "type": "decimal(10,2)"},
            {"name": "updated_at", "type": "timestamptz"},
        ],
        "partition_by": [{"source": "name", "transform": "bucket[4]"}],
        "max_records_per_task": 300,
        "read_timeout_seconds": 20,
        **overrides,
    }
    return parse_pipeline_spec(raw)
