"""Bad values: finding the bad records of a batch without leaving the vectorised path.

One bad record must not make a whole batch decode record by record (a user measured one bad JSON
value in 1,000 making ingestion ~330x slower). The records that cannot be decoded in bulk are found
instead. Every batch is checked for invalid UTF-8 in one pass over its bytes (pyarrow would store
such strings as they are). Once a bulk decode fails, the strict screen
(:func:`screen_json`: orjson, RFC 8259) rejects, without a ``pyarrow`` decode, the
values that are not exactly one JSON object with non-null required fields: first those a vectorised
look flags (not ``{...}``, a required name absent), then, only if the rest still fails in bulk,
every value; what passes the screen and still fails is bisected (halves in bulk, recursively, down
to single records). The contract is strict JSON: a value the screen rejects is rejected in any
batch, alone too, with the same error, so the outcome (rows, rejections, promotions) is that of
decoding every record alone. One exception keeps pyarrow's reading: values holding ``NaN`` or
``Infinity`` (not JSON, read by pyarrow as floats) are decoded alone instead of rejected. The cost
of a batch with truncated or incomplete values is one vectorised pass, O(flagged) screens and two
bulk decodes; other bad values add an O(n) screen and O(bad * log n) bulk decodes.

The screen is cheap checks of JSON values before (or instead of) decoding them:
:func:`screen_json` decides (strict RFC 8259, orjson); :func:`find_suspect_shapes` only points
at values to screen first (a vectorised look: it may flag good values, which the screen then
keeps, and miss bad ones, which a later bulk decode finds); :func:`find_invalid_utf8` checks a
batch's bytes in one pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import orjson
import pyarrow as pa
import pyarrow.compute as pc


def screen_json(payload: bytes, required: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """Why ``payload`` is not exactly one JSON object (RFC 8259, UTF-8) with a non-null value
    for each of ``required``: (error class, message); None when it is.

    Example:
        >>> screen_json(b'{"a": 1}'), screen_json(b"[1]")
        (None, ('ArrowInvalid', 'not a JSON object: a list'))
        >>> screen_json(b'{"b": 1}', ("a",))
        ('MissingRequiredField', "required ['a'] is null")
    """
    try:
        document = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return "ArrowInvalid", f"JSON parse error (strict RFC 8259): {exc}"
    if not isinstance(document, dict):
        return "ArrowInvalid", f"not a JSON object: a {type(document).__name__}"
    missing = [name for name in required if document.get(name) is None]
    if missing:
        return "MissingRequiredField", f"required {missing} is null"
    return None


def find_invalid_utf8(payloads: list[bytes], joined: bytes) -> list[tuple[int, str]]:
    """The values that are not valid UTF-8, with the error: one pass over ``joined`` (the
    values joined by newlines); a per-value check only when that pass fails.

    Example:
        >>> values = [b'{"a": "\\xc3\\xa9"}', b'{"a": "\\xff"}']
        >>> find_invalid_utf8(values, b"\\n".join(values))  # doctest: +ELLIPSIS
        [(1, "not valid UTF-8: 'utf-8' codec can't decode byte 0xff in position 7: ...")]
    """
    if joined.isascii():
        return []
    try:
        joined.decode("utf-8")
        return []
    except UnicodeDecodeError:
        pass
    bad = []
    for row, payload in enumerate(payloads):
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad.append((row, f"not valid UTF-8: {exc}"))
    return bad


def find_suspect_shapes(payloads: list[bytes], required: tuple[str, ...] = ()) -> list[int]:
    """Positions of the values that do not start with ``{`` and end with ``}`` or do not
    mention each of ``required`` as ``"name"``: one vectorised pass, no value decoded.

    Example:
        >>> find_suspect_shapes([b'{"a": 1}', b'{"a": ', b' {"a": 2}', b'{"b": 1}'], ("a",))
        [1, 2, 3]
    """
    if not payloads:
        return []
    values = pa.array(payloads, pa.binary())
    shaped = pc.and_(pc.starts_with(values, "{"), pc.ends_with(values, "}"))
    for name in required:
        shaped = pc.and_(shaped, pc.match_substring(values, f'"{name}"'))
    return pc.indices_nonzero(pc.invert(shaped)).to_pylist()


T = TypeVar("T")
Piece = tuple[list[int], T]
"""Rows (positions in the batch, ascending) and what decoding them in one go gave."""


@dataclass
class DecodeStats:
    """How a batch was decoded: bulk decodes, records decoded alone, records screened."""

    bulk_parses: int = 0
    single_parses: int = 0
    screened: int = 0
    screen_rejected: int = 0
    """Values rejected by the screen (syntax, not an object, required field, UTF-8): no decode."""

    def add(self, other: DecodeStats) -> None:
        """Add ``other``'s counts to these (a task sums its chunks, a run its tasks)."""
        self.bulk_parses += other.bulk_parses
        self.single_parses += other.single_parses
        self.screened += other.screened
        self.screen_rejected += other.screen_rejected


Reject = Callable[[int, str, str], None]
"""(row, error class, message): set a record aside with its error."""


def is_json_object(payload: bytes, required: tuple[str, ...] = ()) -> bool:
    """Whether ``payload`` is exactly one JSON object in UTF-8 (no NaN, no trailing content)
    with a non-null value for each of ``required``.

    Example:
        >>> values = [b'{"a": 1}\\n', b"[1]", b'{"a": 1}{"a": 2}', b" ", b'{"a": "x\\ny"}']
        >>> [is_json_object(v) for v in values], is_json_object(b'{"a": null}', ("a",))
        ([True, False, False, False, False], False)
    """
    return screen_json(payload, required) is None


def flatten_newlines(payload: bytes) -> bytes:
    """Replace CR and LF by spaces in a valid JSON document.

    JSON strings cannot hold raw control characters, so in a document that passed
    :func:`is_json_object` a CR or LF is whitespace between tokens: as a space the document
    means the same and can share a newline-delimited bulk parse.

    Example:
        >>> flatten_newlines(b'{"a":\\r\\n 1}')
        b'{"a":   1}'
    """
    return payload.replace(b"\n", b" ").replace(b"\r", b" ")


def bisect_bulk(
    rows: list[int],
    bulk: Callable[[list[int]], T],
    single: Callable[[int], T | None],
    errors: tuple[type[Exception], ...],
    known_bad: bool = False,
) -> list[Piece[T]]:
    """Decode ``rows`` in bulk; where that raises one of ``errors``, bisect.

    ``single`` decodes one record alone and returns None when it is set aside (it records why).
    ``known_bad`` skips the bulk attempt the caller has just seen fail. Returns the pieces in
    row order.

    Example:
        >>> def bulk(rows):
        ...     if 3 in rows:
        ...         raise ValueError(rows)
        ...     return len(rows)
        >>> bisect_bulk(list(range(8)), bulk, lambda row: None, (ValueError,))
        [([0, 1], 2), ([2], 1), ([4, 5, 6, 7], 4)]
    """
    if not rows:
        return []
    if not known_bad:
        try:
            return [(rows, bulk(rows))]
        except errors:
            pass
    if len(rows) == 1:
        value = single(rows[0])
        return [] if value is None else [(rows, value)]
    middle = len(rows) // 2
    return bisect_bulk(rows[:middle], bulk, single, errors) + bisect_bulk(
        rows[middle:], bulk, single, errors
    )


def _reads_non_finite(payload: bytes) -> bool:
    """Whether ``payload`` may hold NaN or Infinity, which pyarrow reads and JSON does not."""
    return b"NaN" in payload or b"Infinity" in payload


def isolate_json(
    payloads: list[bytes],
    bulk: Callable[[list[bytes]], T],
    single: Callable[[int], T | None],
    reject: Reject,
    errors: tuple[type[Exception], ...],
    stats: DecodeStats,
    required: tuple[str, ...] = (),
) -> list[Piece[T]]:
    """Decode JSON ``payloads``: in bulk where possible, the suspect ones alone.

    Rejected by ``reject`` without a decode: values that are not UTF-8 (every batch), and,
    once a bulk decode failed, every value :func:`screen_json` finds is not one JSON object
    with its ``required`` (non-nullable) fields. Decoded alone by ``single``: blank values
    (they would collapse a row of a newline-delimited parse), values with a CR/LF that are not
    one JSON object (those that are lose the line breaks, see :func:`flatten_newlines`), and
    values the screen rejects that may hold NaN or Infinity. The rest is bisected
    (:func:`bisect_bulk`).
    Delivery: every payload is either in exactly one returned piece, rejected once, or passed
    to ``single``, which keeps it or sets it aside; pieces come back in no particular order.
    """
    clean = list(payloads)
    suspect_set: set[int] = set()
    if b"" in payloads or any(map(bytes.isspace, payloads)):  # no Python frame per value
        suspect_set = {i for i, p in enumerate(payloads) if not p or p.isspace()}
    joined = b"\n".join(payloads)
    rejected = set()
    for row, message in find_invalid_utf8(payloads, joined):
        reject(row, "UnicodeDecodeError", message)
        rejected.add(row)
    stats.screen_rejected += len(rejected)
    if b"\r" in joined or joined.count(b"\n") != len(payloads) - 1:
        for i, payload in enumerate(payloads):
            if i in rejected or payload.isspace():
                continue
            if b"\n" in payload or b"\r" in payload:
                stats.screened += 1
                if is_json_object(payload):
                    clean[i] = flatten_newlines(payload)
                else:
                    suspect_set.add(i)
    rows = list(range(len(payloads)))
    if suspect_set or rejected:
        rows = [i for i in rows if i not in suspect_set and i not in rejected]

    def bulk_rows(chosen: list[int]) -> T:
        return bulk([clean[i] for i in chosen])

    pieces: list[Piece[T]] = []
    if rows:
        try:
            pieces = [(rows, bulk_rows(rows))]
        except errors:

            def screen(chosen: list[int]) -> list[int]:
                """Screen ``chosen`` one by one: reject or set aside the bad; return the rest."""
                stats.screened += len(chosen)
                kept = []
                for i in chosen:
                    reason = screen_json(clean[i], required)
                    if reason is None:
                        kept.append(i)
                    elif reason[1].startswith("JSON parse") and _reads_non_finite(clean[i]):
                        suspect_set.add(i)
                    else:
                        reject(i, *reason)
                        stats.screen_rejected += 1
                return kept

            # First the values a vectorised look calls suspect (most bad ones, few good ones),
            # then one bulk try of the rest; only if that fails too is every value screened.
            flagged = find_suspect_shapes([clean[i] for i in rows], required)
            flagged_rows = [rows[position] for position in flagged]
            bad = set(flagged_rows) - set(screen(flagged_rows))
            rest = [i for i in rows if i not in bad] if bad else rows
            with contextlib.suppress(*errors):
                pieces = [(rest, bulk_rows(rest))] if bad and rest else []
            if not pieces and rest:
                seen = set(flagged_rows)
                objects = screen([i for i in rest if i not in seen])
                objects = sorted({*objects, *(i for i in rest if i in seen)})
                known_bad = len(objects) == len(rest)  # the same rows just failed in bulk
                pieces = bisect_bulk(objects, bulk_rows, single, errors, known_bad)
    for row in sorted(suspect_set):
        value = single(row)
        if value is not None:
            pieces.append(([row], value))
    return pieces
