"""The coordinator's side of executing a plan, without Spark or Kafka: one task spec per range
(with only the executor's hook and its partition's guard), the table metadata tasks receive
(private properties kept on the driver), the schema commit between rounds (new columns, nested
fields, promotions), and the engine's own error line out of a Spark failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from pyiceberg.table import Table

from ingestion.exceptions import DecodeError
from ingestion.kafka.ranges import OffsetRange
from ingestion.pipeline.execute import (
    Prepared,
    build_task_specs,
    evolve_schema,
    prepare_files,
    task_failure_message,
    task_metadata_json,
)
from ingestion.pipeline.hooks import FailureHooks
from ingestion.pipeline.plan import Plan
from ingestion.table.schema import load_or_create_table
from ingestion.task.engine_version import engine_fingerprint
from ingestion.task.spec import RawChunk, Screened
from resources.iceberg import IcebergCatalogResource
from tests.support.pipelines import make_spec

SPEC = make_spec(
    "orders",
    "exe",
    schema=[
        {"name": "id", "type": "long", "required": True},
        {"name": "amount", "type": "decimal(10,2)"},
        {"name": "score", "type": "int"},
        {"name": "customer", "type": "struct<id:long>"},
    ],
)


@pytest.fixture
def table(tmp_path: Path) -> Table:
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    return load_or_create_table(catalog, SPEC)


class KeepAll:
    """A record guard that takes nothing out (the protocol's shape is all that matters here)."""

    needs_headers = False

    def screen(self, raw: RawChunk, keep_headers: bool) -> tuple[RawChunk, Screened]:
        return raw, Screened()


def test_one_task_spec_per_range_with_the_executor_hook_and_its_partitions_guard(
    table: Table,
) -> None:
    tasks = (
        OffsetRange("orders", 0, 0, 10),
        OffsetRange("orders", 0, 10, 20),
        OffsetRange("orders", 1, 5, 8),
    )
    plan = Plan(
        SPEC.name, SPEC.consumer_group_id, SPEC.table, "uuid", None, None, "k", {}, {}, {}, tasks
    )

    def hook(point: str, **context: Any) -> None:
        pass

    hooks = FailureHooks({"in_task": hook, "before_commit": hook})
    guard = KeepAll()
    specs = build_task_specs(
        SPEC,
        plan,
        table,
        None,
        {"bootstrap.servers": "b:1"},
        {"k": "v"},
        hooks,
        {7: "{}"},
        guards={("orders", 0): guard},
        cluster="dr",
    )
    assert [s.range for s in specs] == list(tasks)
    assert {s.commit_id for s in specs} == {plan.commit_id}
    assert [s.guard for s in specs] == [guard, guard, None]
    assert all(set(s.hooks.hooks) == {"in_task"} for s in specs)  # executors get no other
    assert {(s.cluster, s.engine_version, s.quarantine_metadata_json) for s in specs} == {
        ("dr", engine_fingerprint(), None)
    }
    assert specs[0].writer_schemas == {7: "{}"}
    assert specs[0].io_properties == {"k": "v"}
    assert orjson.loads(specs[0].table_metadata_json)["table-uuid"] == str(
        table.metadata.table_uuid
    )


def test_tasks_get_the_table_metadata_without_the_platform_properties(table: Table) -> None:
    """Tasks read the schema, spec, location and write.* properties; the platform's kafka.*
    table properties (a guard's record lists: megabytes) stay on the driver, replicas or not."""
    assert task_metadata_json(table) == table.metadata.model_dump_json()  # nothing to drop
    with table.transaction() as transaction:
        transaction.set_properties(
            {"kafka.uncopied.g": "x" * 1000, "kafka.retired-groups": "y", "write.z": "z"}
        )
    sent = orjson.loads(task_metadata_json(table))
    assert "kafka.uncopied.g" not in sent["properties"]
    assert "kafka.retired-groups" not in sent["properties"]
    assert sent["properties"]["write.z"] == "z"
    assert "kafka.uncopied.g" in table.properties  # the table itself keeps them


def test_the_schema_commit_adds_columns_and_nested_fields_and_promotes(table: Table) -> None:
    changes = evolve_schema(
        table,
        {
            "note": pa.string(),
            "customer": pa.struct([("id", pa.int64()), ("tier", pa.string())]),
        },
        {"amount": pa.decimal128(38, 2), "score": pa.int64()},
    )
    assert changes == [
        "added nested field(s) to customer: now struct<id: int64, tier: string>",
        "added optional column note (string)",
        "promoted amount to decimal128(38, 2)",
        "promoted score to int64",
    ]
    schema = table.refresh().schema()
    assert str(schema.find_field("amount").field_type) == "decimal(38, 2)"
    assert str(schema.find_field("score").field_type) == "long"
    assert not schema.find_field("note").required
    assert str(schema.find_field("customer.tier").field_type) == "string"


def test_no_task_runs_nothing(table: Table) -> None:
    assert prepare_files([], table, None) == Prepared([])


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "Py4JJavaError: An error occurred\n  File x, line 3\n"
            "ingestion.exceptions.DecodeError: offset 7 could not be decoded\n  at ...",
            "ingestion.exceptions.DecodeError: offset 7 could not be decoded",
        ),
        ("noise\nReadError: no progress past offset 4\n", "ReadError: no progress past offset 4"),
        ("java.lang.OutOfMemoryError\nmore", "java.lang.OutOfMemoryError"),
    ],
    ids=["engine-error", "short-name", "other"],
)
def test_a_spark_failure_is_named_by_the_engines_own_error_line(text: str, line: str) -> None:
    assert task_failure_message("p", RuntimeError(text)) == (
        f"pipeline 'p': a Spark task failed, nothing was committed: {line}"
    )


def test_a_failure_without_text_is_named_by_its_type() -> None:
    assert task_failure_message("p", DecodeError("")).endswith(": DecodeError('')")


def test_spark_results_must_be_one_per_task() -> None:
    """What Spark collected becomes the run's results only when every task returned exactly
    once: a missing task (its records would be skipped) or a task twice (its files committed
    twice) fails the run by name, nothing committed. Pure: real Spark returns each task once,
    so the rows are built here."""
    import pickle

    from ingestion.exceptions import TaskFailedError
    from ingestion.pipeline.execute import collected_results
    from ingestion.task.spec import TaskResult

    def row(index: int) -> tuple[int, bytes]:
        return index, pickle.dumps(TaskResult(OffsetRange("t", index, 0, 1), records=index))

    results = collected_results("orders", [row(2), row(0), row(1)], 3)
    assert [r.records for r in results] == [0, 1, 2]  # task order, whatever Spark's order
    for rows, shown in (
        ([row(0), row(2)], "[0, 2] of 3"),
        ([row(0), row(1), row(1), row(2)], "[0, 1, 1, 2] of 3"),
    ):
        with pytest.raises(TaskFailedError) as failed:
            collected_results("orders", rows, 3)
        assert f"pipeline 'orders': Spark returned results for tasks {shown}" in str(failed.value)
        assert "nothing was committed" in str(failed.value)
