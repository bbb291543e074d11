"""What a task receives and returns: a consumed batch appended to a chunk as parallel
per-record lists (headers only when asked), the causes that make the coordinator rerun a task,
and a task spec that survives the pickling that ships it to an executor."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from confluent_kafka import Message

from ingestion.kafka.ranges import OffsetRange
from ingestion.task.spec import RawChunk, TaskResult, TaskSpec


def message(offset: int, key: bytes | None, value: bytes | None, headers: list | None) -> Message:
    return Message(
        topic="t",
        partition=0,
        offset=offset,
        key=key,
        value=value,
        headers=headers,
        timestamp=(1, 1000 + offset),
    )


def test_a_batch_extends_the_chunk_record_by_record() -> None:
    raw = RawChunk()
    raw.extend([message(3, b"k3", b"abc", None), message(4, None, None, [("h", b"1")])])
    raw.extend([message(6, b"k6", b"de", None)])  # a gap: a transaction marker at 5
    assert raw.offsets == [3, 4, 6]
    assert raw.keys == [b"k3", None, b"k6"]
    assert raw.values == [b"abc", None, b"de"]
    assert raw.timestamps == [1003, 1004, 1006]
    assert raw.value_bytes == 5
    assert raw.headers is None  # not asked for: not kept


def test_headers_are_kept_when_asked() -> None:
    raw = RawChunk(headers=[])
    raw.extend([message(0, b"k", b"v", [("a", b"1"), ("a", None)]), message(1, b"k", b"v", None)])
    assert raw.headers == [[("a", b"1"), ("a", None)], None]


@pytest.mark.parametrize(
    ("fields", "rerun"),
    [
        ({}, False),
        ({"records": 10, "quarantined": 2, "skipped": [4]}, False),
        ({"new_fields": {"note": pa.string()}}, True),
        ({"promotions": {"n": pa.int64()}}, True),
        ({"unknown_schema_ids": {7}}, True),
        ({"guard_candidates": 1}, True),
    ],
    ids=["clean", "counts", "new-field", "promotion", "unknown-schema", "guard-candidates"],
)
def test_a_task_reruns_for_a_schema_change_an_unknown_writer_schema_or_a_guard(
    fields: dict[str, object], rerun: bool
) -> None:
    result = TaskResult(OffsetRange("t", 0, 0, 10))
    for name, value in fields.items():
        setattr(result, name, value)
    assert result.needs_rerun is rerun


def test_a_task_spec_survives_the_trip_to_an_executor() -> None:
    spec = TaskSpec(
        pipeline="p",
        range=OffsetRange("t", 1, 5, 9),
        kafka_config={"bootstrap.servers": "b"},
        value_format="json",
        key_format="string",
        table_metadata_json="{}",
        quarantine_metadata_json=None,
        io_properties={},
        errors_tolerance="all",
        commit_id="c",
        writer_schemas={3: "{}"},
        missing_schema_ids=frozenset({4}),
    )
    shipped = pickle.loads(pickle.dumps(spec))
    assert shipped == spec
    assert (shipped.guard, shipped.cluster, shipped.hooks.hooks) == (None, "primary", {})
