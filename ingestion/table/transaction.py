"""Our commits never retry inside pyiceberg: :func:`commit_view`.

Every commit of the engine (the ingestion commit, an upsert's copy-on-write, compaction, resets,
a late copy's release) runs its own compare-and-set loop: it reloads the head, checks what it
must (the group's offsets, the commit id, the candidate files) and commits against that head
once. pyiceberg's own retry would re-apply the commit on a newer head without those checks;
this module turns it off for one handle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.table import Table

NO_RETRY = {"commit.retry.num-retries": "0"}


def commit_view(table: Table) -> Table:
    """A handle on ``table`` whose transactions do not retry by themselves.

    pyiceberg reads ``commit.retry.num-retries`` from the handle's in-memory metadata; this view
    sets it to 0 there only. Nothing of it is written: the catalog applies the commit's updates
    to its own current metadata.
    """
    from pyiceberg.table import Table as IcebergTable

    properties = {**table.metadata.properties, **NO_RETRY}
    metadata = table.metadata.model_copy(update={"properties": properties})
    return IcebergTable(table.name(), metadata, table.metadata_location, table.io, table.catalog)
