"""Finding the bad records of a batch without leaving the vectorised path.

One bad record must not make a whole batch decode record by record (a user measured one bad
JSON value in 1,000 making ingestion ~330x slower). The records that cannot be decoded in bulk
are found instead: values that are not exactly one JSON object by a cheap per-record screen
(orjson, strict RFC 8259), the rest by bisection (halves in bulk, recursively, down to single
records). Only records decoded alone are ever rejected (R33), by the same single-record decode
as before, so the outcome (rows, rejections, promotions) is that of decoding every record alone;
the cost is O(bad) single decodes and O(bad * log n) bulk decodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import orjson

T = TypeVar("T")
Piece = tuple[list[int], T]
"""Rows (positions in the batch, ascending) and what decoding them in one go gave."""


@dataclass
class DecodeStats:
    """How a batch was decoded: bulk decodes, records decoded alone, records screened."""

    bulk_parses: int = 0
    single_parses: int = 0
    screened: int = 0


def is_json_object(payload: bytes, required: tuple[str, ...] = ()) -> bool:
    """Whether ``payload`` is exactly one JSON object in UTF-8 (no NaN, no trailing content)
    with a non-null value for each of ``required``.

    Example:
        >>> values = [b'{"a": 1}\\n', b"[1]", b'{"a": 1}{"a": 2}', b" ", b'{"a": "x\\ny"}']
        >>> [is_json_object(v) for v in values], is_json_object(b'{"a": null}', ("a",))
        ([True, False, False, False, False], False)
    """
    try:
        document = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    return isinstance(document, dict) and all(document.get(n) is not None for n in required)


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


def isolate_json(
    payloads: list[bytes],
    bulk: Callable[[list[bytes]], T],
    single: Callable[[int], T | None],
    errors: tuple[type[Exception], ...],
    stats: DecodeStats,
    required: tuple[str, ...] = (),
) -> list[Piece[T]]:
    """Decode JSON ``payloads``: in bulk where possible, the suspect ones alone.

    Suspects, decoded alone by ``single``: blank values (they would collapse a row of a
    newline-delimited parse), values with a CR/LF that are not one JSON object (those that are
    lose the line breaks, see :func:`flatten_newlines`), and, once a bulk decode failed, every
    value the screen finds is not one JSON object with its ``required`` (non-nullable) fields.
    The rest is bisected (:func:`bisect_bulk`).
    Delivery: every payload is either in exactly one returned piece or was passed to ``single``,
    which keeps it or sets it aside; pieces come back in no particular order.
    """
    clean = list(payloads)
    suspects = [i for i, p in enumerate(payloads) if not p or p.isspace()]
    joined = b"\n".join(payloads)
    if b"\r" in joined or joined.count(b"\n") != len(payloads) - 1:
        for i, payload in enumerate(payloads):
            if (b"\n" in payload or b"\r" in payload) and not payload.isspace():
                stats.screened += 1
                if is_json_object(payload):
                    clean[i] = flatten_newlines(payload)
                else:
                    suspects.append(i)
    suspect_set = set(suspects)
    rows = [i for i in range(len(payloads)) if i not in suspect_set]

    def bulk_rows(chosen: list[int]) -> T:
        return bulk([clean[i] for i in chosen])

    pieces: list[Piece[T]] = []
    if rows:
        try:
            pieces = [(rows, bulk_rows(rows))]
        except errors:
            stats.screened += len(rows)
            objects = [i for i in rows if is_json_object(clean[i], required)]
            suspect_set.update(set(rows) - set(objects))
            pieces = bisect_bulk(objects, bulk_rows, single, errors, len(objects) == len(rows))
    for row in sorted(suspect_set):
        value = single(row)
        if value is not None:
            pieces.append(([row], value))
    return pieces
