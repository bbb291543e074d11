"""JSON values carry dates and times of day as ISO text: decoded vectorised, bad ones rejected."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from ingestion.formats.decode import decode_json

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.date32()), ("at", pa.time64("us"))])


@pytest.mark.parametrize(
    ("value", "row"),
    [
        (b'{"id": 1, "day": "2026-11-23", "at": "10:00:00"}', (dt.date(2026, 11, 23), dt.time(10))),
        (b'{"id": 2, "day": null, "at": "23:59:59.123456"}', (None, dt.time(23, 59, 59, 123456))),
        (b'{"id": 3}', (None, None)),
    ],
    ids=["date-and-time", "null-date-fractional-time", "absent"],
)
def test_iso_text_dates_and_times_decode(value: bytes, row: tuple[object, object]) -> None:
    decoded = decode_json([value], SCHEMA)
    assert decoded.rejections == []
    (record,) = decoded.table.to_pylist()
    assert (record["day"], record["at"]) == row
    assert decoded.table.schema.field("day").type == pa.date32()


def test_a_bad_date_is_rejected_alone() -> None:
    """One impossible date in a batch rejects that record only; the others decode."""
    values: list[bytes | None] = [
        b'{"id": 1, "day": "2026-11-23"}',
        b'{"id": 2, "day": "2026-02-30"}',
        b'{"id": 3, "day": "2026-11-24"}',
    ]
    decoded = decode_json(values, SCHEMA)
    assert [r.index for r in decoded.rejections] == [1]
    assert decoded.indices == [0, 2]
    assert [r["id"] for r in decoded.table.to_pylist()] == [1, 3]
