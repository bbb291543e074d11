"""Creating tables (ingestion/table/schema.py) on a real SQL catalog."""

from __future__ import annotations

import threading
from pathlib import Path

from ingestion.table.schema import load_or_create_table
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
