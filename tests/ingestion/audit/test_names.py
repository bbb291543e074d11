"""The audit of one record held under two topic names (ingestion/dr/audit_names.py), on a real
pyiceberg table: rows written with the table's own schema, as the engine writes them."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow

from ingestion.audit.names import find_cross_name_twins
from ingestion.audit.oracle import audit_table
from ingestion.dr.audit_names import name_families
from ingestion.table.schema import load_or_create_table
from resources.iceberg import IcebergCatalogResource
from tests.support.pipelines import make_spec

REPLICAS = [{"name": "dr", "source_alias": "primary"}]
AT = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.UTC)


def row(topic: str, offset: int, ident: int, key: str | None, ms: int = 0) -> dict[str, object]:
    return {
        "id": ident,
        "name": f"n{ident}",
        "amount": Decimal("1.25"),
        "ts": AT,
        "_kafka_topic": topic,
        "_kafka_partition": 0,
        "_kafka_offset": offset,
        "_kafka_timestamp": AT + dt.timedelta(milliseconds=ms),
        "_kafka_key": key,
        "_kafka_headers": [],
    }


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        # A copy ingested twice: on the primary, and from MM2's copy on the replica.
        (
            [row("orders", 5, 1, "k1"), row("primary.orders", 3, 1, "k1")],
            ["orders[0]@5 = primary.orders[0]@3"],
        ),
        # Keyless records in one millisecond under two names, with other values: not twins.
        ([row("orders", 5, 1, None), row("primary.orders", 3, 2, None)], []),
        # A producer's own repeat under one name is the topic's truth, not a duplicate.
        ([row("orders", 5, 1, "k1"), row("orders", 6, 1, "k1")], []),
        # The same body at another timestamp is another record.
        ([row("orders", 5, 1, "k1"), row("dr.orders", 3, 1, "k1", ms=1)], []),
        # A topic outside the families (not one of the pipeline's names) is not read.
        ([row("orders", 5, 1, "k1"), row("other.orders", 3, 1, "k1")], []),
    ],
)
def test_a_record_under_two_names_is_a_duplicate(
    catalog_resource: IcebergCatalogResource,
    rows: list[dict[str, object]],
    expected: list[str],
    request: pytest.FixtureRequest,
) -> None:
    name = "names_" + request.node.callspec.id.replace("-", "_")[:40]
    spec = make_spec("orders", name, replicas=REPLICAS)
    table = load_or_create_table(catalog_resource.load_catalog(), spec)
    table.append(pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema())))
    assert find_cross_name_twins(table, name_families(spec)) == expected
    audited = audit_table(table, spec.consumer_group_id, families=name_families(spec))
    assert audited.cross_name_duplicates == expected
    if expected:
        assert "cross_name_duplicates: 1" in audited.summary()
