"""Our commits never retry inside pyiceberg: a stale ``commit_view`` fails where a plain
handle on the same stale head would re-apply its commit on the newer one. Real SQL catalog."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from ingestion.table.transaction import NO_RETRY, commit_view
from tests.support.catalogs import local_catalog, region_table

ROWS = pa.table({"region": ["eu"], "n": [1]})


def _append_properties(handle: Table, value: str) -> None:
    with (
        handle.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties={"mark": value}).fast_append(),
    ):
        pass


def _marks(table: Table) -> list[str]:
    return [
        mark
        for snapshot in table.snapshots()
        if snapshot.summary is not None and (mark := snapshot.summary.get("mark")) is not None
    ]


def test_a_stale_view_fails_instead_of_retrying_on_the_new_head(tmp_path: Path) -> None:
    catalog = local_catalog(tmp_path)
    table = region_table(catalog)
    stale = catalog.load_table("n.t")
    table.append(ROWS)  # the head moves under ``stale``

    with pytest.raises(CommitFailedException):
        _append_properties(commit_view(stale), "view")

    head = catalog.load_table("n.t")
    assert _marks(head) == []
    assert not set(NO_RETRY) & set(head.metadata.properties), "the view writes no property"


def test_a_plain_stale_handle_retries_on_the_new_head(tmp_path: Path) -> None:
    """What the view turns off: pyiceberg's own retry, which re-applies the commit on the new
    head without our checks. When this fails, pyiceberg stopped retrying by default."""
    catalog = local_catalog(tmp_path)
    table = region_table(catalog)
    stale = catalog.load_table("n.t")
    table.append(ROWS)

    _append_properties(stale, "plain")

    head = catalog.load_table("n.t")
    assert _marks(head) == ["plain"]
