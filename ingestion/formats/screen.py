"""Cheap checks of JSON values before (or instead of) decoding them: strict JSON, UTF-8, shape.

Used by ``ingestion/formats/isolate.py`` to find the bad records of a batch without decoding records
one by one. :func:`screen_json` decides (strict RFC 8259, orjson); :func:`find_suspect_shapes`
only points at values to screen first (a vectorised look: it may flag good values, which the
screen then keeps, and miss bad ones, which a later bulk decode finds).
"""

from __future__ import annotations

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
