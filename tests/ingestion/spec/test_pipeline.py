"""Pipeline spec validation: every invalid spec fails at load, naming the pipeline and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingestion.exceptions import PipelineSpecError
from ingestion.spec.pipeline import load_pipeline_specs, parse_pipeline_spec

ROOT = Path(__file__).resolve().parents[3]


def base_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "orders",
        "topic": "orders",
        "table": "demo.orders",
        "consumer_group_id": "g",
        "schema": [{"name": "order_id", "type": "string", "required": True}],
    }
    spec.update(changes)
    return {key: value for key, value in spec.items() if value is not None}


def test_valid_spec_defaults() -> None:
    spec = parse_pipeline_spec(base_spec())
    assert spec.consumer_group_id == "g"
    assert spec.quarantine_table == "demo.orders_quarantine"
    assert spec.source_topics == ["orders"]
    assert spec.errors_tolerance == "none"
    assert spec.on_data_loss == "fail"
    assert spec.starting_position.mode == "earliest"


@pytest.mark.parametrize(
    ("changes", "key", "message"),
    [
        ({"topic": None}, "<spec>", "exactly one of topic, topics or topic_pattern"),
        ({"topics": ["a"]}, "<spec>", "exactly one of topic, topics or topic_pattern"),
        ({"topic": None, "topics": []}, "<spec>", "non-empty list"),
        ({"topic": None, "topic_pattern": "orders-("}, "<spec>", "not a valid regex"),
        ({"table": "orders"}, "<spec>", "'namespace.table'"),
        ({"commit_group_id": "other"}, "<spec>", "differs from consumer_group_id"),
        ({"value_format": "avro"}, "<spec>", "needs schema_registry_url"),
        ({"schema": None}, "<spec>", "needs a declared schema"),
        ({"value_format": "xml"}, "value_format", "Input should be"),
        ({"errors_tolerance": "some"}, "errors_tolerance", "Input should be"),
        ({"on_data_loss": "ignore"}, "on_data_loss", "Input should be"),
        ({"max_records_per_task": 0}, "max_records_per_task", "greater than 0"),
        ({"name": "Orders!"}, "name", "String should match pattern"),
        ({"consumer_group_id": ""}, "consumer_group_id", "at least 1 character"),
        ({"unknown_key": 1}, "unknown_key", "Extra inputs are not permitted"),
        ({"schema": [{"name": "a", "type": "varchar"}]}, "schema.0.type", "unknown type"),
        ({"schema": [{"name": "a", "type": "decimal(40,2)"}]}, "schema.0.type", "unknown type"),
        ({"schema": [{"name": "_kafka_offset", "type": "long"}]}, "<spec>", "'_kafka_'"),
        (
            {"schema": [{"name": "a", "type": "long"}, {"name": "a", "type": "int"}]},
            "<spec>",
            "repeated field names",
        ),
        ({"partition_by": [{"source": "nope", "transform": "day"}]}, "<spec>", "not schema"),
        (
            {"partition_by": [{"source": "order_id", "transform": "bucket[0]"}]},
            "partition_by.0.transform",
            "unknown transform",
        ),
        ({"starting_position": {"mode": "timestamp"}}, "starting_position", "timestamp_ms"),
        ({"freshness_target_seconds": 0}, "freshness_target_seconds", "greater than 0"),
        ({"snapshot_retention_hours": 0}, "snapshot_retention_hours", "greater than 0"),
        ({"snapshot_retention_hours": "soon"}, "snapshot_retention_hours", "valid number"),
        (
            {"freshness_target_seconds": 15, "max_lag_seconds": 60},
            "<spec>",
            "set freshness_target_seconds or max_lag_seconds, not both",
        ),
        (
            {"starting_position": {"mode": "offsets", "offsets": {"orders": 3}}},
            "starting_position",
            "'topic:partition'",
        ),
        (  # MM2 would never create the reverse copy (a cycle under its default policy)
            {
                "replicas": [
                    {
                        "name": "dr",
                        "source_alias": "primary",
                        "failback_replication_policy": "default",
                    }
                ]
            },
            "replicas.0",
            "cannot fail back",
        ),
        ({"mode": "upsert"}, "<spec>", "key_fields is required with mode 'upsert'"),
        ({"key_fields": ["order_id"]}, "<spec>", "key_fields is required with mode 'upsert'"),
        ({"mode": "upsert", "key_fields": ["id"]}, "<spec>", "key_fields ['id'] are not columns"),
        (
            {"mode": "upsert", "key_fields": ["order_id", "order_id"]},
            "<spec>",
            "repeat a field",
        ),
        (
            {
                "mode": "upsert",
                "key_fields": ["k"],
                "schema": [{"name": "k", "type": "struct<a:long>"}],
            },
            "<spec>",
            "must be primitive columns",
        ),
        (
            {"mode": "upsert", "key_fields": ["order_id"], "value_format": "raw", "schema": None},
            "<spec>",
            "raw values carry no row",
        ),
        (
            {
                "mode": "upsert",
                "key_fields": ["k"],
                "value_format": "avro",
                "schema_registry_url": "http://registry:8081",
                "schema": [{"name": "k", "type": "double"}],
            },
            "<spec>",
            "float, double, uuid, binary and fixed cannot be keys",
        ),
        (
            {
                "mode": "upsert",
                "key_fields": ["order_id"],
                "schema": [
                    {"name": "order_id", "type": "long"},
                    {"name": "_cdc_op", "type": "string"},
                ],
            },
            "<spec>",
            "'_cdc_'",
        ),
        ({"mode": "upsert", "key_fields": ["order_id"], "envelope": "avro"}, "envelope", "Input"),
        (
            {"mode": "upsert", "key_fields": ["f"], "schema": [{"name": "f", "type": "double"}]},
            "<spec>",
            "float, double, uuid, binary and fixed cannot be keys",
        ),
        (  # 'primary' names the pipeline's own cluster (_kafka_cluster, failover --to)
            {"replicas": [{"name": "primary", "source_alias": "east"}]},
            "replicas.0.name",
            "replica name 'primary' is reserved",
        ),
    ],
)
def test_invalid_spec_names_pipeline_and_key(
    changes: dict[str, Any], key: str, message: str
) -> None:
    with pytest.raises(PipelineSpecError) as excinfo:
        parse_pipeline_spec(base_spec(**changes))
    text = str(excinfo.value)
    assert f"pipeline {changes.get('name', 'orders')!r} is invalid" in text
    assert f"{key}:" in text
    assert message in text


def test_an_upsert_table_is_keyed_and_sorted_by_its_key_fields() -> None:
    """mode: upsert (docs/cdc.md): the key fields are required identifier fields, the change
    columns come before the Kafka ones, and the table is created sorted by the key."""
    from ingestion.table.schema import build_schema, build_sort_order

    spec = parse_pipeline_spec(
        base_spec(
            mode="upsert",
            key_fields=["order_id"],
            schema=[{"name": "order_id", "type": "string"}, {"name": "n", "type": "long"}],
        )
    )
    schema = build_schema(spec)
    key = schema.find_field("order_id")
    assert key.required
    assert list(schema.identifier_field_ids) == [key.field_id]
    names = schema.column_names
    assert names.index("_cdc_op") < names.index("_kafka_topic")
    assert {"_cdc_source_ts_ms", "_cdc_lsn"} <= set(names)
    (field,) = build_sort_order(spec, schema).fields
    assert field.source_id == key.field_id
    append = build_schema(parse_pipeline_spec(base_spec()))
    assert "_cdc_op" not in append.column_names
    assert not append.identifier_field_ids


def test_seed_misconfiguration_is_rejected_with_both_ids() -> None:
    with pytest.raises(PipelineSpecError) as excinfo:
        parse_pipeline_spec(
            base_spec(consumer_group_id="connect-sink-group", commit_group_id="cg-control")
        )
    assert "'cg-control'" in str(excinfo.value)
    assert "'connect-sink-group'" in str(excinfo.value)
    assert "Set both to the same id" in str(excinfo.value)


@pytest.mark.parametrize(
    "transform", ["identity", "year", "month", "day", "hour", "bucket[16]", "truncate[4]"]
)
def test_partition_transforms_accepted(transform: str) -> None:
    spec = parse_pipeline_spec(
        base_spec(partition_by=[{"source": "order_id", "transform": transform}])
    )
    assert spec.partition_by[0].transform == transform


def test_repo_pipelines_file_loads() -> None:
    specs = load_pipeline_specs(ROOT / "platform_assets" / "pipelines.yaml")
    assert [spec.name for spec in specs] == ["orders"]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("pipelines: {}\n", "expected a top-level 'pipelines:' list"),
        ("[]\n", "expected a top-level 'pipelines:' list"),
    ],
)
def test_malformed_file(tmp_path: Path, document: str, message: str) -> None:
    path = tmp_path / "pipelines.yaml"
    path.write_text(document)
    with pytest.raises(PipelineSpecError, match=message):
        load_pipeline_specs(path)


def test_pipelines_must_not_share_a_table(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "pipelines.yaml"
    first = base_spec()
    second = base_spec(name="orders_copy", consumer_group_id="g2")
    path.write_text(yaml.safe_dump({"pipelines": [first, second]}))
    with pytest.raises(PipelineSpecError, match=r"pipelines share table \['demo.orders'\]"):
        load_pipeline_specs(path)
