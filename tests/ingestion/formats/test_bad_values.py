"""Dirty batches decode at bulk speed with the outcome of decoding every record alone."""

from __future__ import annotations

import math
from decimal import Decimal

import pyarrow as pa
import pytest

from ingestion.formats.avro import rows_to_arrow
from ingestion.formats.bad_values import (
    bisect_bulk,
    find_invalid_utf8,
    find_suspect_shapes,
    screen_json,
)
from ingestion.formats.decode import Decoded, decode_json

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("amount", pa.decimal128(6, 2)),
        ("n", pa.int32()),
        ("day", pa.date32()),
        ("note", pa.string()),
    ]
)
REQUIRED = ("id",)


def good(i: int) -> bytes:
    return b'{"id": %d, "amount": %d.25, "n": 1, "day": "2026-11-23", "note": "r%d"}' % (
        i,
        i % 1000,
        i,
    )


# (bad value, what becomes of it): "row" = decoded, "promotion" = reported, else error class
CASES = [
    (b'{"id": 5, "amount": ', "ArrowInvalid"),  # bad syntax (truncated)
    (b"\xff\xfe{}", "UnicodeDecodeError"),  # not UTF-8
    (b'{"id": 4, "note": "caf\xe9"}', "UnicodeDecodeError"),  # Latin-1 inside a JSON string
    (b"[1, 2]", "ArrowInvalid"),  # not an object
    (b"42", "ArrowInvalid"),
    (b'{"id": "x"}', "ArrowInvalid"),  # type error: string for a long
    (b'{"id": 3, "day": "2026-02-30"}', "ArrowInvalid"),  # impossible date (text-typed column)
    (b'{"id": 3, "amount": 1.234}', "ArrowInvalid"),  # more scale than the column: no rounding
    (b"", "ArrowInvalid"),  # blank
    (b"  \t ", "ArrowInvalid"),  # blank: rejected, never a promotion
    (b"\n", "ArrowInvalid"),
    (None, "NullValue"),  # tombstone
    (b'{"id": 1}{"id": 2}', "ArrowInvalid"),  # two objects in one value
    (b'{"id": 7, "note": "a\nb"}', "ArrowInvalid"),  # raw newline inside a string
    (b'{"amount": 1.00}', "MissingRequiredField"),
    (b'{\n  "id": 7,\r\n  "note": "multi-line"\n}', "row"),  # newlines as whitespace
    (b'{"id": 8, "n": 3000000000}', "promotion"),  # int -> long (R35)
    (b'{"id": 9, "amount": 12345.55}', "promotion"),  # decimal precision widening (R35)
]
IDS = [
    "syntax",
    "utf8",
    "utf8-in-string",
    "array",
    "number",
    "type",
    "date",
    "scale",
    "empty",
    "blank",
    "newline-only",
    "tombstone",
    "two-objects",
    "raw-newline-in-string",
    "missing-required",
    "multi-line-object",
    "promote-int",
    "promote-decimal",
]


def alone(values: list[bytes | None]) -> list[Decoded]:
    """The reference: every value decoded in a batch of its own."""
    return [decode_json([value], SCHEMA, REQUIRED) for value in values]


def assert_same_as_alone(values: list[bytes | None], decoded: Decoded) -> None:
    reference = alone(values)
    expected_rows = [(i, r.table.to_pylist()[0]) for i, r in enumerate(reference) if r.indices]
    assert decoded.indices == [i for i, _ in expected_rows]
    assert decoded.table.to_pylist() == [
        {**{name: None for name in decoded.table.column_names}, **row} for _, row in expected_rows
    ]
    assert [(r.index, r.error_class, r.message) for r in decoded.rejections] == [
        (i, r.error_class, r.message) for i, ref in enumerate(reference) for r in ref.rejections
    ]
    promotions = {k: v for ref in reference for k, v in ref.promotions.items()}
    assert decoded.promotions == promotions


@pytest.mark.parametrize(("bad", "outcome"), CASES, ids=IDS)
@pytest.mark.parametrize("position", [0, 57, 199])
def test_one_bad_value_among_good_ones(bad: bytes | None, outcome: str, position: int) -> None:
    values: list[bytes | None] = [good(i) for i in range(200)]
    values[position] = bad
    decoded = decode_json(values, SCHEMA, REQUIRED)
    others = [i for i in range(200) if i != position]
    assert_same_as_alone(values, decoded)
    if outcome == "row":
        assert decoded.indices == list(range(200))
        assert decoded.table.column("note")[position].as_py() == "multi-line"
    else:
        assert decoded.indices == others
        assert decoded.table.column("id").to_pylist() == others
        assert decoded.table.column("amount")[0].as_py() == Decimal(f"{others[0] % 1000}.25")
    if outcome == "promotion":
        assert decoded.promotions
        assert not decoded.rejections
    elif outcome != "row":
        assert [(r.index, r.error_class) for r in decoded.rejections] == [(position, outcome)]
        assert not decoded.promotions
    assert decoded.table.column("id").num_chunks <= 2


def test_every_kind_at_once_keeps_order_and_indices() -> None:
    """All bad kinds spread through one batch, blank next to a two-object value (which
    together would keep the row count of a newline-delimited parse and shift rows)."""
    values: list[bytes | None] = [good(i) for i in range(500)]
    for slot, (bad, _) in enumerate(CASES):
        values[20 + 25 * slot] = bad
    values[21], values[22] = b"", b'{"id": 1}{"id": 2}'
    decoded = decode_json(values, SCHEMA, REQUIRED)
    assert_same_as_alone(values, decoded)
    assert decoded.indices == sorted(decoded.indices)
    ids = decoded.table.column("id").to_pylist()
    multi_line = 20 + 25 * IDS.index("multi-line-object")  # its id is 7
    assert [ids[k] for k, i in enumerate(decoded.indices) if i != multi_line] == [
        i for i in decoded.indices if i != multi_line
    ]
    assert decoded.table.column("id").num_chunks == 1


def test_clean_batch_with_newlines_stays_in_bulk() -> None:
    values: list[bytes | None] = [good(i).replace(b", ", b",\n ") for i in range(1000)]
    decoded = decode_json(values, SCHEMA, REQUIRED)
    assert decoded.indices == list(range(1000))
    assert (decoded.stats.bulk_parses, decoded.stats.single_parses) == (1, 0)


@pytest.mark.parametrize(
    ("bad", "max_bulk", "singles"),
    [
        (b'{"id": 5, "amount": ', 2, 0),  # the screen rejects it: one bulk parse again
        (b'{"id": "x"}', 2 * math.ceil(math.log2(50_000)) + 1, 1),  # bisected
        (b'{"id": 9, "amount": 12345.55}', 2 * math.ceil(math.log2(50_000)) + 1, 1),
    ],
    ids=["syntax", "type", "promotion"],
)
def test_one_bad_record_in_50k_costs_log_n_bulk_parses(
    bad: bytes, max_bulk: int, singles: int
) -> None:
    values: list[bytes | None] = [good(i) for i in range(50_000)]
    values[25_000] = bad
    decoded = decode_json(values, SCHEMA, REQUIRED)
    assert decoded.stats.single_parses == singles
    assert decoded.stats.screen_rejected == 1 - singles
    assert 2 <= decoded.stats.bulk_parses <= max_bulk
    assert len(decoded.indices) == 49_999
    assert decoded.table.column("id").num_chunks < 100


def test_many_syntax_errors_cost_no_single_parse() -> None:
    """10 % truncated values: one failed bulk parse, one screen, one bulk parse of the rest."""
    values: list[bytes | None] = [good(i) for i in range(50_000)]
    bad = range(5, 50_000, 10)
    for i in bad:
        values[i] = good(i)[:-9]  # truncated
    decoded = decode_json(values, SCHEMA, REQUIRED)
    assert [r.index for r in decoded.rejections] == list(bad)
    assert (decoded.stats.bulk_parses, decoded.stats.single_parses) == (2, 0)
    assert decoded.stats.screen_rejected == len(bad)
    assert decoded.table.column("id").to_pylist() == decoded.indices


@pytest.mark.parametrize("bad", [{1}, {0, 1, 2, 3}, {5, 6}, {0, 63}, set(range(0, 64, 3))])
def test_bisect_finds_exactly_the_bad_rows(bad: set[int]) -> None:
    calls: list[list[int]] = []

    def bulk(rows: list[int]) -> list[int]:
        calls.append(rows)
        if bad & set(rows):
            raise ValueError(rows)
        return rows

    singles: list[int] = []

    def single(row: int) -> list[int] | None:
        singles.append(row)
        return None if row in bad else [row]

    pieces = bisect_bulk(list(range(64)), bulk, single, (ValueError,))
    assert sorted(singles) == sorted(bad)
    assert [row for rows, _ in pieces for row in rows] == [r for r in range(64) if r not in bad]
    assert len(calls) <= 1 + 2 * len(bad) * math.ceil(math.log2(64))


@pytest.mark.parametrize("position", [0, 500, 999])
def test_avro_rows_one_bad_row_is_set_aside(position: int) -> None:
    rows: list[dict[str, object]] = [{"id": i, "amount": Decimal("1.25")} for i in range(1000)]
    rows[position] = {"id": "not a long", "amount": Decimal("1.25")}
    schema = pa.schema([("id", pa.int64()), ("amount", pa.decimal128(6, 2))])
    table, bad = rows_to_arrow(rows, schema)
    assert list(bad) == [position]
    assert table.column("id").to_pylist() == [i for i in range(1000) if i != position]


@pytest.mark.parametrize("bad", [b'{"amount": 1.00}', b'{"id": null}'], ids=["absent", "null"])
def test_required_field_screened_when_the_schema_says_not_null(bad: bytes) -> None:
    """The engine's schema marks required columns not-null: pyarrow then fails the bulk parse
    on a missing one; the screen sets such records aside (no bisection, no promotion tries)."""
    schema = SCHEMA.set(0, pa.field("id", pa.int64(), nullable=False))
    values: list[bytes | None] = [good(i) for i in range(50_000)]
    bad_rows = range(100, 50_000, 100)
    for i in bad_rows:
        values[i] = bad
    decoded = decode_json(values, schema, REQUIRED)
    assert [r.index for r in decoded.rejections] == list(bad_rows)
    assert decoded.rejections[0].message == decode_json([bad], schema).rejections[0].message
    assert (decoded.stats.bulk_parses, decoded.stats.single_parses) == (2, 0)
    assert decoded.stats.screen_rejected == len(bad_rows)
    assert decoded.rejections[0].error_class == "MissingRequiredField"
    assert not decoded.promotions


@pytest.mark.parametrize(
    ("payload", "outcome"),
    [
        (b'{"a": 1}', None),
        (b'{"a": 1}\n', None),  # trailing whitespace is JSON
        (b"", "ArrowInvalid"),  # empty payload
        (b"  ", "ArrowInvalid"),
        (b"[1, 2]", "ArrowInvalid"),  # valid JSON, not an object
        (b'"text"', "ArrowInvalid"),
        (b"null", "ArrowInvalid"),
        (b'{"a": 1}{"a": 2}', "ArrowInvalid"),  # trailing content
        (b'{"a": 1,}', "ArrowInvalid"),
        (b'{"a": NaN}', "ArrowInvalid"),  # not JSON (decode_json decodes it alone, see below)
        (b'{"a": "caf\xe9"}', "ArrowInvalid"),  # invalid UTF-8 in a string
        (b'{"b": 1}', "MissingRequiredField"),
        (b'{"a": null}', "MissingRequiredField"),
        (b'{"a": -0.0}', None),
    ],
)
def test_screen_json(payload: bytes, outcome: str | None) -> None:
    reason = screen_json(payload, ("a",))
    assert (reason and reason[0]) == outcome


@pytest.mark.parametrize(
    ("values", "bad"),
    [
        ([], []),
        ([b""], []),
        ([b'{"a": "\xc3\xa9"}'], []),  # valid multi-byte UTF-8
        ([b'{"a": "\xc3"}', b"{}"], [0]),  # truncated sequence
        ([b"{}", b'{"a": "\xed\xa0\x80"}'], [1]),  # an encoded surrogate is not UTF-8
        ([b"\xc3", b"\xa9"], [0, 1]),  # invalid alone, valid only joined without the newline
    ],
    ids=["none", "empty", "valid", "truncated", "surrogate", "split-sequence"],
)
def test_find_invalid_utf8(values: list[bytes], bad: list[int]) -> None:
    assert [row for row, _ in find_invalid_utf8(values, b"\n".join(values))] == bad


def test_invalid_utf8_in_a_string_is_rejected_even_when_the_bulk_parse_passes() -> None:
    """pyarrow reads invalid UTF-8 inside a JSON string into a string column as it is (a
    corrupt Parquet string): the value is rejected in every batch, in bulk and alone."""
    values: list[bytes | None] = [good(i) for i in range(1000)]
    values[500] = b'{"id": 500, "note": "caf\xe9"}'
    decoded = decode_json(values, SCHEMA, REQUIRED)
    assert [(r.index, r.error_class) for r in decoded.rejections] == [(500, "UnicodeDecodeError")]
    assert (decoded.stats.bulk_parses, decoded.stats.single_parses) == (1, 0)
    assert decoded.indices == [i for i in range(1000) if i != 500]
    assert_same_as_alone(values, decoded)


def test_nan_is_read_as_pyarrow_reads_it_in_any_batch() -> None:
    """NaN is not JSON but pyarrow reads it as a float: kept, in bulk and after a screen."""
    values: list[bytes | None] = [good(i) for i in range(100)]
    values[10] = b'{"id": 10, "score": NaN}'
    values[20] = b'{"id": 20, "amount": '  # makes the bulk parse fail: the screen runs
    decoded = decode_json(values, SCHEMA, REQUIRED)
    assert [r.index for r in decoded.rejections] == [20]
    assert math.isnan(decoded.table.column("score")[10].as_py())
    assert decoded.indices == [i for i in range(100) if i != 20]
    alone_nan = decode_json([values[10]], SCHEMA, REQUIRED)
    assert math.isnan(alone_nan.table.column("score")[0].as_py())


@pytest.mark.parametrize("order", ["number-first", "text-first"])
def test_mixed_type_new_field_in_one_chunk_is_no_poison_pill(order: str) -> None:
    """A new field holding numbers in some records and text in others: the first type (in
    offset order) wins, the records that do not convert to it are rejected, nothing raises."""
    number, text = b'{"id": %d, "extra": 7}', b'{"id": %d, "extra": "seven"}'
    first, second = (number, text) if order == "number-first" else (text, number)
    values: list[bytes | None] = [first % i for i in range(1000)]
    values += [second % i for i in range(1000, 1010)] + [good(i) for i in range(1010, 2000)]
    decoded = decode_json(values, SCHEMA, REQUIRED)
    if order == "number-first":
        assert decoded.new_fields == {"extra": pa.int64()}
        assert [r.index for r in decoded.rejections] == list(range(1000, 1010))
        assert {r.error_class for r in decoded.rejections} == {"MixedFieldType"}
    else:  # numbers convert to text: nothing to reject
        assert decoded.new_fields == {"extra": pa.string()}
        assert not decoded.rejections
    assert len(decoded.indices) + len(decoded.rejections) == 2000
    assert decoded.table.column("id").to_pylist() == decoded.indices


def test_int_and_double_new_field_widens_to_double() -> None:
    values: list[bytes | None] = [b'{"id": %d, "x": 1}' % i for i in range(100)]
    values += [b'{"id": 100, "x": 1.5}', b'{"id": 101, "x": "bad"}']
    decoded = decode_json(values, SCHEMA, REQUIRED)
    assert decoded.new_fields == {"x": pa.float64()}
    assert [r.index for r in decoded.rejections] == [101]


def test_negative_and_positive_zero_stay_distinct_partition_values() -> None:
    """-0.0 and 0.0 compare equal but are different values (identity partition, R33 rows):
    both are decoded as they are, sign kept, in bulk and alone."""
    values: list[bytes | None] = [b'{"id": 1, "p": -0.0}', b'{"id": 2, "p": 0.0}']
    decoded = decode_json(values, SCHEMA, REQUIRED)
    signs = [math.copysign(1, v) for v in decoded.table.column("p").to_pylist()]
    assert signs == [-1.0, 1.0]
    assert [
        math.copysign(1, decode_json([v], SCHEMA).table.column("p")[0].as_py()) for v in values
    ] == signs


@pytest.mark.parametrize(
    ("values", "flagged"),
    [
        ([], []),
        ([b'{"id": 1}'], []),
        ([b'{"id": 1'], [0]),  # truncated
        ([b""], [0]),
        ([b' {"id": 1} '], [0]),  # valid: flagged only, the screen keeps it
        ([b"[1]", b'"{id}"'], [0, 1]),
        ([b'{"name": "no id"}'], [0]),  # no "id" name: flagged
        ([b'{"id": 1, "x": }'], []),  # bad inside the braces: not flagged, found later
    ],
)
def test_find_suspect_shapes(values: list[bytes], flagged: list[int]) -> None:
    assert find_suspect_shapes(values, ("id",)) == flagged


@pytest.mark.parametrize("share", [0.001, 0.01, 0.1])
def test_truncated_and_incomplete_values_cost_two_bulk_parses_at_any_rate(share: float) -> None:
    """Flagged by the vectorised look, screened alone, the rest parsed once more in bulk."""
    schema = SCHEMA.set(0, pa.field("id", pa.int64(), nullable=False))
    values: list[bytes | None] = [good(i) for i in range(20_000)]
    step = int(1 / share)
    bad = list(range(3, 20_000, step))
    for n, i in enumerate(bad):
        values[i] = good(i)[:-9] if n % 2 else b'{"amount": 1.00}'
    decoded = decode_json(values, schema, REQUIRED)
    assert [r.index for r in decoded.rejections] == bad
    assert (decoded.stats.bulk_parses, decoded.stats.single_parses) == (2, 0)
    assert decoded.stats.screened == decoded.stats.screen_rejected == len(bad)
    assert decoded.indices == [i for i in range(20_000) if i not in set(bad)]
