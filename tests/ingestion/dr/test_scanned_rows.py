"""The failback plan's one scan per topic, held as columns (``ingestion.dr.scanned_rows``), answers
every window exactly as a fresh scan of that partition does: inside what it keeps, at its
edges (the floor, the last row, gaps, duplicates between the data and the quarantine table),
and refuses (None) below a floor or on a partition it did not scan. A real pyiceberg SQL
catalog on local files; no Kafka or Spark is needed for table reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from ingestion.dr.rows import holds_rows, ingested_tail
from ingestion.dr.scanned_rows import Scans, scan_rows

TOPIC = "orders"
FLOORS = {0: 20, 1: 25, 2: 21, 4: 0}  # 3 has rows but is not scanned; 4 is scanned, empty
BASE = datetime(2026, 1, 1, tzinfo=UTC)


def arrow_schema(key: pa.DataType) -> pa.Schema:
    return pa.schema(
        [
            pa.field("_kafka_topic", pa.string(), nullable=False),
            pa.field("_kafka_partition", pa.int32(), nullable=False),
            pa.field("_kafka_offset", pa.int64(), nullable=False),
            pa.field("_kafka_timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("_kafka_key", key),
            pa.field("_kafka_cluster", pa.string()),
        ]
    )


def rows(
    partition: int, offsets: list[int], key: pa.DataType, topic: str = TOPIC, tag: str = "k"
) -> pa.Table:
    """Rows read on the primary below offset 20, on dr from there; every 7th key null."""
    keys = [None if o % 7 == 3 else f"{tag}{partition}-{o}" for o in offsets]
    return pa.table(
        {
            "_kafka_topic": [topic] * len(offsets),
            "_kafka_partition": [partition] * len(offsets),
            "_kafka_offset": offsets,
            "_kafka_timestamp": [BASE + timedelta(microseconds=1500 * o + 1) for o in offsets],
            "_kafka_key": [k if k is None or key == pa.string() else k.encode() for k in keys],
            "_kafka_cluster": ["dr" if o >= 20 else "primary" for o in offsets],
        },
        schema=arrow_schema(key),
    )


def make_tables(where: Path, key: pa.DataType) -> list[Table]:
    """A data table written out of offset order over several files, and a quarantine table
    holding two offsets the data table holds too (its rows are read last)."""
    catalog = SqlCatalog("s", uri=f"sqlite:///{where}/c.db", warehouse=f"file://{where}")
    catalog.create_namespace("n")
    schema = Schema(
        NestedField(1, "_kafka_topic", StringType(), required=True),
        NestedField(2, "_kafka_partition", IntegerType(), required=True),
        NestedField(3, "_kafka_offset", LongType(), required=True),
        NestedField(4, "_kafka_timestamp", TimestamptzType(), required=False),
        NestedField(5, "_kafka_key", StringType() if key == pa.string() else BinaryType()),
        NestedField(6, "_kafka_cluster", StringType(), required=False),
    )
    data = catalog.create_table("n.data", schema)
    data.append(rows(0, list(range(30, 60)), key))
    data.append(rows(0, list(range(0, 30)), key))
    data.append(rows(1, list(range(0, 60)), key))
    data.append(rows(2, list(range(0, 60, 2)), key))  # gaps: odd offsets missing
    data.append(rows(3, list(range(0, 60)), key))
    data.append(rows(0, list(range(0, 60)), key, topic="other"))
    quarantine = catalog.create_table("n.quarantine", schema)
    quarantine.append(rows(0, [25, 41], key, tag="q"))  # also in the data table
    quarantine.append(rows(1, [60, 61], key, tag="q"))
    return [catalog.load_table("n.data"), catalog.load_table("n.quarantine")]


@pytest.fixture(scope="module", params=[pa.binary(), pa.string()], ids=["binary", "string"])
def tables(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[Table]:
    return make_tables(tmp_path_factory.mktemp("scanned"), request.param)


WINDOWS = [
    (0, 20, 30),  # from the floor
    (0, 20, 21),  # the floor alone
    (0, 24, 26),  # an offset in both tables: the quarantine's row
    (0, 33, 42),  # inside
    (0, 59, 60),  # the last row
    (0, 41, 10_000),  # past the end
    (0, 60, 70),  # after the last row: none
    (0, 30, 30),  # empty window
    (0, 35, 31),  # reversed window
    (1, 25, 62),  # the floor, through the quarantine's rows past the data
    (1, 61, 62),
    (2, 21, 24),  # starts in a gap
    (2, 21, 22),  # only a gap
    (2, 58, 1000),
    (4, 0, 100),  # scanned, no rows
]
UNCOVERED = [(0, 19, 30), (1, 24, 30), (2, 0, 60), (3, 20, 30), (3, 55, 60)]


@pytest.mark.parametrize("cluster", [None, "dr"])
@pytest.mark.parametrize("window", WINDOWS, ids=[str(w) for w in WINDOWS])
def test_a_window_is_what_a_fresh_scan_of_the_partition_gives(
    tables: list[Table], cluster: str | None, window: tuple[int, int, int]
) -> None:
    partition, start, until = window
    scanned = scan_rows(tables, TOPIC, FLOORS, cluster)
    fresh = ingested_tail(tables, TOPIC, partition, start, until, cluster)
    assert scanned.window(partition, start, until) == fresh
    expected = {
        (p, o)
        for p, offsets in {0: range(60), 1: range(62), 2: range(0, 60, 2)}.items()
        for o in offsets
    }
    assert [o for o, _ in fresh] == [
        o for o in range(start, min(until, 100)) if (partition, o) in expected
    ]


def test_the_rows_are_those_read_last_with_their_keys_and_timestamps(
    tables: list[Table],
) -> None:
    window = scan_rows(tables, TOPIC, FLOORS).window(0, 23, 27)
    assert window is not None
    since = int(BASE.timestamp() * 1000)
    assert [(o, r.key, r.timestamp_ms - since) for o, r in window] == [
        (23, b"k0-23", 34),
        (24, None, 36),  # 24 % 7 == 3: a null key
        (25, b"q0-25", 37),  # the quarantine table's row, read after the data table's
        (26, b"k0-26", 39),
    ]


@pytest.mark.parametrize("window", UNCOVERED, ids=[str(w) for w in UNCOVERED])
def test_a_window_below_a_floor_or_of_a_partition_not_scanned_is_not_answered(
    tables: list[Table], window: tuple[int, int, int]
) -> None:
    assert scan_rows(tables, TOPIC, FLOORS).window(*window) is None
    assert ingested_tail(tables, TOPIC, *window) != []  # there are rows it would have missed


@pytest.mark.parametrize(("partition", "offset"), [(0, 19), (0, 20), (0, 45), (2, 21), (2, 22)])
def test_holds_until_answers_as_the_existence_probe(
    tables: list[Table], partition: int, offset: int
) -> None:
    held = scan_rows(tables, TOPIC, FLOORS, "dr").holds_until(partition, offset)
    probe = holds_rows(tables, (TOPIC, partition), f"_kafka_offset <= {offset}", "dr")
    assert held in (None, probe)  # None: the scan cannot tell, the caller probes
    assert held is (True if (partition, offset) in {(0, 20), (0, 45), (2, 22)} else None)


def test_a_covered_request_reuses_the_scan_and_a_wider_one_scans_again(
    tables: list[Table],
) -> None:
    scans: Scans = {}
    first = scan_rows(tables, TOPIC, FLOORS, "dr", scans)
    assert scan_rows(tables, TOPIC, {0: 30, 2: 21}, "dr", scans) is first
    assert scan_rows(tables, TOPIC, FLOORS, None, scans) is not first  # another cluster
    wider = scan_rows(tables, TOPIC, {**FLOORS, 3: 5}, "dr", scans)
    fresh = ingested_tail(tables, TOPIC, 3, 20, 23, "dr")
    assert wider is not first
    assert wider.window(3, 20, 23) == fresh
    assert len(fresh) == 3
    assert first.nbytes < 40 * 97  # 97 rows kept: int64 offset and timestamp, a short key
