"""A throw-away SQL catalog (SQLite file and local warehouse under a test's ``tmp_path``) with
one namespace ``n``: the real catalog for tests that need a table and no Kafka."""

from __future__ import annotations

from pathlib import Path

from pyiceberg.catalog.sql import SqlCatalog


def local_catalog(tmp_path: Path, name: str = "c") -> SqlCatalog:
    """A new SQL catalog named ``name`` in ``tmp_path``, its namespace ``n`` created."""
    catalog = SqlCatalog(
        name, uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/warehouse"
    )
    catalog.create_namespace("n")
    return catalog
