"""Type strings of the pipeline schema: primitives, ``decimal(p,s)`` and nested types.

Grammar (case-insensitive, spaces allowed between tokens)::

    type   := primitive | decimal(P,S) | struct<field, ...> | list<elem> | map<key, elem>
    field  := name ':' type ['not null']
    elem   := type ['not null']

``not null`` marks a struct field, a list element or a map value as required (a record where
it is absent or null is rejected, like a top-level ``required: true`` field); map keys are
always required. Nested fields get fresh Iceberg field ids (depth first) when converted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.types import IcebergType

PRIMITIVES = (
    "boolean",
    "int",
    "long",
    "float",
    "double",
    "date",
    "time",
    "timestamp",
    "timestamptz",
    "string",
    "uuid",
    "binary",
)
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(.))")


class TypeStringError(ValueError):
    """A type string does not parse; the message names the position."""


@dataclass(frozen=True)
class Node:
    """A parsed type: ``kind`` is a primitive name, 'decimal', 'struct', 'list' or 'map'."""

    kind: str
    children: tuple[tuple[str, Node, bool], ...] = ()  # (name, type, required)
    precision: int = 0
    scale: int = 0

    @property
    def nested(self) -> bool:
        """Whether this is a struct, list or map."""
        return self.kind in ("struct", "list", "map")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        groups = [(m, m.lastindex) for m in _TOKEN.finditer(text)]
        self.tokens = [(m.start(g), m.group(g)) for m, g in groups if g is not None]
        self.i = 0

    def fail(self, expected: str) -> TypeStringError:
        at, seen = self.tokens[self.i] if self.i < len(self.tokens) else (len(self.text), "end")
        return TypeStringError(
            f"at position {at} of {self.text!r}: expected {expected}, got {seen!r}"
        )

    def peek(self) -> str:
        return self.tokens[self.i][1].lower() if self.i < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if not token or (expected is not None and token != expected):
            raise self.fail(repr(expected) if expected else "a token")
        self.i += 1
        return self.tokens[self.i - 1][1]

    def number(self) -> int:
        if not self.peek().isdigit():
            raise self.fail("a number")
        return int(self.take())

    def required(self) -> bool:
        if self.peek() == "not":
            self.take()
            self.take("null")
            return True
        return False

    def type(self) -> Node:
        kind = self.peek()
        if kind in PRIMITIVES:
            self.take()
            return Node(kind)
        if kind == "decimal":
            self.take()
            self.take("(")
            precision = self.number()
            self.take(",")
            scale = self.number()
            self.take(")")
            if not 1 <= precision <= 38 or scale > precision:
                raise TypeStringError(f"{self.text!r}: decimal({precision},{scale}) out of range")
            return Node("decimal", precision=precision, scale=scale)
        if kind == "struct":
            return self.struct()
        if kind == "list":
            self.take()
            self.take("<")
            element = self.type()
            node = Node("list", (("element", element, self.required()),))
            self.take(">")
            return node
        if kind == "map":
            self.take()
            self.take("<")
            key = self.type()
            self.take(",")
            value = self.type()
            node = Node("map", (("key", key, True), ("value", value, self.required())))
            self.take(">")
            return node
        raise self.fail(f"a type ({', '.join(PRIMITIVES)}, decimal(p,s), struct, list, map)")

    def struct(self) -> Node:
        self.take()
        self.take("<")
        fields: list[tuple[str, Node, bool]] = []
        while True:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.peek() or "-"):
                raise self.fail("a field name")
            name = self.tokens[self.i][1]
            self.i += 1
            self.take(":")
            kind = self.type()
            fields.append((name, kind, self.required()))
            if self.peek() != ",":
                break
            self.take(",")
        self.take(">")
        names = [name for name, _, _ in fields]
        if len(set(names)) != len(names):
            raise TypeStringError(f"{self.text!r}: struct has repeated field names")
        return Node("struct", tuple(fields))


def parse_type_string(text: str) -> Node:
    """Parse a type string; raise :class:`TypeStringError` naming the position.

    Example:
        >>> node = parse_type_string("list<struct<sku:string not null, qty:int>>")
        >>> node.kind, [(n, t.kind, r) for n, t, r in node.children[0][1].children]
        ('list', [('sku', 'string', True), ('qty', 'int', False)])
    """
    parser = _Parser(text)
    node = parser.type()
    if parser.i != len(parser.tokens):
        raise parser.fail("end of type")
    return node


def to_iceberg(node: Node, ids: Iterator[int]) -> IcebergType:
    """The Iceberg type of ``node``, nested fields numbered from ``ids`` (depth first).

    Example:
        >>> import itertools
        >>> kind = to_iceberg(parse_type_string("map<string, long>"), itertools.count(10))
        >>> str(kind), kind.key_id, kind.value_id
        ('map<string, long>', 10, 11)
    """
    from pyiceberg import types

    if node.kind == "decimal":
        return types.DecimalType(node.precision, node.scale)
    if node.kind == "struct":
        fields = []
        for name, child, required in node.children:
            field_id = next(ids)
            fields.append(types.NestedField(field_id, name, to_iceberg(child, ids), required))
        return types.StructType(*fields)
    if node.kind == "list":
        _, element, required = node.children[0]
        element_id = next(ids)
        return types.ListType(element_id, to_iceberg(element, ids), element_required=required)
    if node.kind == "map":
        (_, key, _), (_, value, required) = node.children
        key_id, value_id = next(ids), next(ids)
        return types.MapType(
            key_id, to_iceberg(key, ids), value_id, to_iceberg(value, ids), value_required=required
        )
    primitives: dict[str, IcebergType] = {
        "boolean": types.BooleanType(),
        "int": types.IntegerType(),
        "long": types.LongType(),
        "float": types.FloatType(),
        "double": types.DoubleType(),
        "date": types.DateType(),
        "time": types.TimeType(),
        "timestamp": types.TimestampType(),
        "timestamptz": types.TimestamptzType(),
        "string": types.StringType(),
        "uuid": types.UUIDType(),
        "binary": types.BinaryType(),
    }
    return primitives[node.kind]


def format_type(node: Node) -> str:
    """The canonical spelling of ``node`` (lower case, no spaces but after commas).

    Example:
        >>> format_type(parse_type_string("STRUCT< id : long NOT NULL , tags: list<string>>"))
        'struct<id:long not null, tags:list<string>>'
    """
    if node.kind == "decimal":
        return f"decimal({node.precision},{node.scale})"
    suffix = {True: " not null", False: ""}
    if node.kind == "struct":
        inner = ", ".join(f"{n}:{format_type(t)}{suffix[r]}" for n, t, r in node.children)
        return f"struct<{inner}>"
    if node.kind == "list":
        _, element, required = node.children[0]
        return f"list<{format_type(element)}{suffix[required]}>"
    if node.kind == "map":
        (_, key, _), (_, value, required) = node.children
        return f"map<{format_type(key)}, {format_type(value)}{suffix[required]}>"
    return node.kind
