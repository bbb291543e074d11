"""Nested columns (struct, list, map) between ``pyarrow.json`` and the table's Arrow types.

``pyarrow.json`` reads structs and lists against an explicit schema, but not maps, large
lists, dates or times of day. :func:`read_type` gives the type to read instead (a map is read
as a struct whose fields are inferred, one per key seen in the batch; a date or time as its ISO
text) and
:func:`fix_array` converts what was read into the table's type, vectorised: a JSON object
becomes map entries with Arrow ``take`` over the inferred children, never a per-record loop.
A value that does not convert raises ``ArrowInvalid``, so the caller's isolation finds the
record and rejects it alone.

Map semantics: a JSON ``null`` value inside a map reads as an absent key (the struct read
cannot tell them apart), and a map value's struct must not carry fields its type lacks (no
evolution inside map values: such a record is rejected). Struct fields not in the schema are
kept (they are new nested fields, see :func:`nested_additions`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def read_type(kind: pa.DataType) -> pa.DataType:
    """The type ``pyarrow.json`` reads for a column of type ``kind``.

    Example:
        >>> read_type(pa.struct([("d", pa.date32()), ("m", pa.map_(pa.string(), pa.int64()))]))
        StructType(struct<d: string, m: struct<>>)
    """
    if pa.types.is_map(kind):
        return pa.struct([])
    if pa.types.is_date(kind) or pa.types.is_time(kind):
        return pa.string()
    # Nested required fields are read as optional (pyarrow.json rejects a required child of a
    # null struct) and checked by fix_array: null where its parent is not is an error.
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(read_type(f.type)).with_nullable(True) for f in kind.fields])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        element = kind.value_field.with_type(read_type(kind.value_type)).with_nullable(True)
        return pa.list_(element)  # pyarrow.json reads no large_list
    return kind


def needs_fix(kind: pa.DataType) -> bool:
    """Whether a column of type ``kind`` is read as another type and converted after."""
    return read_type(kind) != kind


def fix_column(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    """Convert a column read with :func:`read_type` into ``kind`` (chunk by chunk)."""
    try:
        chunks = [fix_array(chunk, kind) for chunk in column.chunks]
    except (pa.ArrowTypeError, OverflowError) as exc:  # for the caller: a value that won't fit
        raise pa.ArrowInvalid(f"{exc} (converting to {kind})") from exc
    return pa.chunked_array(chunks) if chunks else pa.chunked_array([], kind)


def fix_array(array: pa.Array, kind: pa.DataType, strict: bool = False) -> pa.Array:
    """Convert ``array`` into ``kind``; raise ``ArrowInvalid`` when a value does not fit.

    Example:
        >>> read = pa.array([{"a": 1, "b": None}, None, {"a": None, "b": 2}])
        >>> fix_array(read, pa.map_(pa.string(), pa.int64())).to_pylist()
        [[('a', 1)], None, [('b', 2)]]
    """
    if array.type == kind:
        return array
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), kind)
    if pa.types.is_map(kind):
        return _to_map(_expect_struct(array, kind), kind)
    if pa.types.is_struct(kind):
        return _to_struct(_expect_struct(array, kind), kind, strict)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
            raise pa.ArrowInvalid(f"expected a JSON array for {kind}, got {array.type}")
        offsets = array.offsets
        offsets = pc.subtract(offsets, offsets[0]) if len(offsets) else offsets
        values = fix_array(array.flatten(), kind.value_type, strict)
        if not kind.value_field.nullable and values.null_count:
            raise pa.ArrowInvalid(f"a required list element was null ({kind})")
        builder = pa.LargeListArray if pa.types.is_large_list(kind) else pa.ListArray
        element = kind.value_field.with_type(values.type)  # new struct fields kept
        return builder.from_arrays(
            offsets.cast(pa.int64() if builder is pa.LargeListArray else pa.int32()),
            values,
            type=pa.large_list(element) if builder is pa.LargeListArray else pa.list_(element),
            mask=array.is_null() if array.null_count else None,
        )
    if pa.types.is_time(kind):  # no string -> time cast: a timestamp on 1970-01-01
        stamps = pc.binary_join_element_wise("1970-01-01T", array, "").cast(pa.timestamp("us"))
        return stamps.cast(pa.int64()).cast(pa.time64("us")).cast(kind)
    return array.cast(kind)


def _expect_struct(array: pa.Array, kind: pa.DataType) -> pa.StructArray:
    if not isinstance(array, pa.StructArray):
        raise pa.ArrowInvalid(f"expected a JSON object for {kind}, got {array.type}")
    return array


def _to_struct(array: pa.StructArray, kind: pa.StructType, strict: bool) -> pa.Array:
    names = [f.name for f in kind.fields]
    extra = [f for f in array.type.fields if f.name not in names]
    if strict and any(array.field(f.name).null_count < len(array) for f in extra):
        raise pa.ArrowInvalid(f"fields {[f.name for f in extra]} are not in {kind} (map value)")
    present = {f.name for f in array.type.fields}
    children = [
        fix_array(array.field(f.name), f.type, strict)
        if f.name in present
        else pa.nulls(len(array), f.type)
        for f in kind.fields
    ]
    fields = list(kind.fields)
    if not strict:
        children += [array.field(f.name) for f in extra]
        fields += extra
    for f, child in zip(kind.fields, children, strict=False):
        if (
            not f.nullable
            and child.null_count
            and pc.any(pc.and_(child.is_null(), array.is_valid())).as_py()
        ):
            raise pa.ArrowInvalid(f"a required nested field {f.name!r} was absent or null")
    mask = array.is_null() if array.null_count else None
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def _to_map(array: pa.StructArray, kind: pa.MapType) -> pa.Array:
    """JSON objects read as a struct (one field per key) -> map entries in key order."""
    rows, width = len(array), array.type.num_fields
    value_type = kind.item_type
    if width == 0:
        offsets = pa.array(np.zeros(rows + 1, np.int32))
        keys, items = pa.array([], kind.key_type), pa.array([], value_type)
    else:
        children = [
            fix_array(array.field(i), value_type, strict=True).cast(value_type)
            for i in range(width)
        ]
        stacked = pa.concat_arrays(children)  # position of (row, key) = key * rows + row
        order = (np.arange(width)[None, :] * rows + np.arange(rows)[:, None]).ravel()
        present = pc.is_valid(stacked).to_numpy(zero_copy_only=False)[order]
        if array.null_count:  # a null object has no entries (its children read null anyway)
            present &= np.repeat(array.is_valid().to_numpy(zero_copy_only=False), width)
        chosen = order[present]
        counts = present.reshape(rows, width).sum(axis=1)
        offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        names = pa.array([f.name for f in array.type.fields], pa.large_string())
        keys = names.take(pa.array(chosen // rows)).cast(kind.key_type)
        items = stacked.take(pa.array(chosen))
    mask = array.is_null() if array.null_count else None
    return pa.MapArray.from_arrays(offsets, keys, items, type=kind, mask=mask)


def nested_additions(declared: pa.DataType, seen: pa.DataType) -> pa.DataType | None:
    """``seen`` without field metadata if it adds struct fields (not all-null) to
    ``declared``, inside structs and lists; else None. Maps take no additions.

    Example:
        >>> old = pa.struct([("id", pa.int64())])
        >>> nested_additions(old, pa.struct([("id", pa.int64()), ("tag", pa.string())]))
        StructType(struct<id: int64, tag: string>)
        >>> nested_additions(old, pa.struct([("id", pa.int64()), ("tag", pa.null())])) is None
        True
    """
    if pa.types.is_struct(declared) and pa.types.is_struct(seen):
        fields, added = [], False
        known = {f.name: f for f in declared.fields}
        for f in seen.fields:
            if f.name not in known:
                kind = _strip(f.type)
                if kind is not None:
                    fields.append(pa.field(f.name, kind))
                    added = True
                continue
            inner = nested_additions(known[f.name].type, f.type)
            added |= inner is not None
            kind = inner or _strip(known[f.name].type)
            fields.append(pa.field(f.name, kind, known[f.name].nullable))
        return pa.struct(fields) if added else None
    lists = (pa.types.is_list, pa.types.is_large_list)
    if any(t(declared) for t in lists) and any(t(seen) for t in lists):
        inner = nested_additions(declared.value_type, seen.value_type)
        if inner is None:
            return None
        element = pa.field("element", inner, declared.value_field.nullable)
        return pa.large_list(element) if pa.types.is_large_list(declared) else pa.list_(element)
    return None


def _strip(kind: pa.DataType) -> pa.DataType | None:
    """``kind`` without field metadata and without all-null (untyped) struct fields."""
    if pa.types.is_null(kind):
        return None
    if pa.types.is_struct(kind):
        fields = [(f, _strip(f.type)) for f in kind.fields]
        return pa.struct([pa.field(f.name, t, f.nullable) for f, t in fields if t is not None])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        inner = _strip(kind.value_type) or pa.string()
        element = pa.field("element", inner, kind.value_field.nullable)
        return pa.large_list(element) if pa.types.is_large_list(kind) else pa.list_(element)
    if pa.types.is_map(kind):
        item = _strip(kind.item_type) or pa.string()
        return pa.map_(_strip(kind.key_type) or pa.string(), item)
    return kind


def promotion_candidates(schema: pa.Schema) -> Iterator[tuple[str, pa.Schema, pa.DataType]]:
    """Every single promotion Iceberg allows in ``schema``, nested leaves included: (dotted
    path as pyiceberg names it, the schema with that leaf widened, the wider type).

    Example:
        >>> schema = pa.schema([("c", pa.struct([("n", pa.int32())])), ("f", pa.float32())])
        >>> [(path, str(wider)) for path, _, wider in promotion_candidates(schema)]
        [('c.n', 'int64'), ('f', 'double')]
    """
    for index, column in enumerate(schema):
        for path, kind, wider in _leaf_promotions(column.type):
            full = ".".join([column.name, *path])
            yield full, schema.set(index, column.with_type(kind)), wider


def widen(kind: pa.DataType) -> pa.DataType | None:
    """The type an Iceberg promotion allows for ``kind``: int->long, float->double, decimal
    precision widening (scale kept); None when there is none (R35).

    Example:
        >>> widen(pa.int32()), widen(pa.decimal128(12, 2)), widen(pa.string())
        (DataType(int64), Decimal128Type(decimal128(38, 2)), None)
    """
    if kind == pa.int32():
        return pa.int64()
    if kind == pa.float32():
        return pa.float64()
    if pa.types.is_decimal(kind) and kind.precision < 38:
        return pa.decimal128(38, kind.scale)
    return None


def _leaf_promotions(kind: pa.DataType) -> Iterator[tuple[list[str], pa.DataType, pa.DataType]]:
    """(path below ``kind``, ``kind`` with that leaf widened, the wider leaf type)."""
    wider = widen(kind)
    if wider is not None:
        yield [], wider, wider
    elif pa.types.is_struct(kind):
        for i, child in enumerate(kind.fields):
            for path, changed, leaf in _leaf_promotions(child.type):
                fields = list(kind.fields)
                fields[i] = child.with_type(changed)
                yield [child.name, *path], pa.struct(fields), leaf
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        for path, changed, leaf in _leaf_promotions(kind.value_type):
            element = kind.value_field.with_type(changed)
            rebuilt = pa.large_list(element) if pa.types.is_large_list(kind) else pa.list_(element)
            yield ["element", *path], rebuilt, leaf
    elif pa.types.is_map(kind):
        for path, changed, leaf in _leaf_promotions(kind.item_type):
            rebuilt = pa.map_(kind.key_field, kind.item_field.with_type(changed))
            yield ["value", *path], rebuilt, leaf


def cast_nested(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    """``column.cast(kind)``, also when a required nested field holds nulls under null
    parents (valid Arrow that pyarrow's cast refuses): rebuilt from its children then.

    Example:
        >>> kind = pa.struct([pa.field("id", pa.int64(), nullable=False)])
        >>> valid = pa.array([False, True])
        >>> array = pa.StructArray.from_arrays([pa.array([1, None])], fields=list(kind), mask=valid)
        >>> cast_nested(pa.chunked_array([array]), kind).to_pylist()
        [{'id': 1}, None]
    """
    if column.type != kind:
        try:
            column = column.cast(kind)
        except pa.ArrowInvalid:
            column = pa.chunked_array([_cast_array(c, kind) for c in column.chunks], kind)
    if not _has_required_nested(kind):
        return column
    return pa.chunked_array([_fill_required(chunk) for chunk in column.chunks], kind)


def _has_required_nested(kind: pa.DataType) -> bool:
    if pa.types.is_struct(kind):
        return any(not f.nullable or _has_required_nested(f.type) for f in kind.fields)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return not kind.value_field.nullable or _has_required_nested(kind.value_type)
    if pa.types.is_map(kind):
        return _has_required_nested(kind.item_type)  # keys and entries: handled by Arrow
    return False


def _fill_required(array: pa.Array) -> pa.Array:
    """Mark required nested fields valid where only a null parent made them null: Parquet
    writers refuse a non-nullable child with nulls, even under null parents."""
    kind = array.type
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(kind):
        children = []
        for i, f in enumerate(kind.fields):
            child = _fill_required(array.field(i))
            children.append(child if f.nullable else _all_valid(child))
        return pa.StructArray.from_arrays(children, fields=list(kind.fields), mask=mask)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        values = _fill_required(array.flatten())
        values = values if kind.value_field.nullable else _all_valid(values)
        offsets = pc.subtract(array.offsets, array.offsets[0])
        builder = pa.LargeListArray if pa.types.is_large_list(kind) else pa.ListArray
        return builder.from_arrays(offsets, values, type=kind, mask=mask)
    return array


def _all_valid(array: pa.Array) -> pa.Array:
    """``array`` without its validity bitmap (its values under nulls are kept as they are)."""
    if not array.null_count:
        return array
    if pa.types.is_struct(array.type):
        fields = list(array.type.fields)
        return pa.StructArray.from_arrays(
            [array.field(i) for i in range(len(fields))], fields=fields
        )
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        builder = pa.LargeListArray if pa.types.is_large_list(array.type) else pa.ListArray
        offsets = pc.subtract(array.offsets, array.offsets[0])
        return builder.from_arrays(offsets, array.flatten(), type=array.type)
    buffers = [None, *array.buffers()[1:]]
    return pa.Array.from_buffers(array.type, len(array), buffers, 0, array.offset)


def _cast_array(array: pa.Array, kind: pa.DataType) -> pa.Array:
    if array.type == kind:
        return array
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(kind) and isinstance(array, pa.StructArray):
        present = {f.name for f in array.type.fields}
        children = [
            _cast_array(array.field(f.name), f.type)
            if f.name in present
            else pa.nulls(len(array), f.type)
            for f in kind.fields
        ]
        return pa.StructArray.from_arrays(children, fields=list(kind.fields), mask=mask)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets = pc.subtract(array.offsets, array.offsets[0])
        large = pa.types.is_large_list(kind)
        builder = pa.LargeListArray if large else pa.ListArray
        values = _cast_array(array.flatten(), kind.value_type)
        return builder.from_arrays(
            offsets.cast(pa.int64() if large else pa.int32()), values, type=kind, mask=mask
        )
    return array.cast(kind)
