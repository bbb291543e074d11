"""Creating tables (ingestion/table/schema.py) on a real SQL catalog."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import FixedType

from ingestion.exceptions import PipelineSpecError
from ingestion.table.schema import build_schema, load_or_create_table
from resources.iceberg import IcebergCatalogResource
from tests.support.pipelines import make_spec


def test_lanes_creating_their_tables_at_once_share_a_new_namespace(tmp_path: Path) -> None:
    """A stream worker starts its lanes together on a fresh catalog: each creates its table in
    the same new namespace. Losing the namespace's check-then-insert race is not a failure
    (before: an IntegrityError, the lane failed and restarted 30 s later)."""
    resource = IcebergCatalogResource(state_dir=str(tmp_path))
    resource.load_catalog()  # the folder and the catalog's tables exist before the race
    lanes = 8
    start, failures = threading.Barrier(lanes), list[BaseException]()

    def lane(index: int) -> None:
        catalog = resource.load_catalog()  # one catalog per lane, as the worker's lanes have
        spec = make_spec("orders", f"p{index}", table=f"race.p{index}")
        start.wait()
        try:
            load_or_create_table(catalog, spec)
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    catalog = resource.load_catalog()
    assert sorted(t for _, t in catalog.list_tables("race")) == [f"p{i}" for i in range(lanes)]


def _derived() -> Schema:
    from pyiceberg.types import IntegerType, NestedField, StringType

    return Schema(
        NestedField(1, "id", IntegerType(), required=False),
        NestedField(2, "status", StringType(), required=True),  # NOT NULL, added later
        NestedField(3, "f", FixedType(4), required=False),
    )


def test_a_derived_upsert_table_requires_its_key_alone() -> None:
    """From the registry: the key made required (the identifier), every other column optional
    (a change written before ``status`` was added still applies); an append table keeps the
    registered row's requirements."""
    avro = {"value_format": "avro", "schema_registry_url": "http://registry:8081", "schema": None}
    upsert = make_spec("t", "derived", mode="upsert", key_fields=["id"], **avro)
    fields = {f.name: f for f in build_schema(upsert, _derived()).fields}
    assert (fields["id"].required, fields["status"].required) == (True, False)
    assert build_schema(upsert, _derived()).identifier_field_names() == {"id"}
    append = make_spec("t", "derived_append", **avro)
    assert build_schema(append, _derived()).find_field("status").required


def test_a_derived_upsert_table_refuses_an_unusable_key_by_name() -> None:
    avro = {"value_format": "avro", "schema_registry_url": "http://registry:8081", "schema": None}
    for key, reason in (("nope", "are not columns"), ("f", "binary and fixed cannot be keys")):
        spec = make_spec("t", "derived_key", mode="upsert", key_fields=[key], **avro)
        with pytest.raises(PipelineSpecError, match=rf"'derived_key'.*{re.escape(reason)}"):
            build_schema(spec, _derived())
