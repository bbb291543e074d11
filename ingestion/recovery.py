"""Step 5, recover: remove files that no snapshot references (crashed or aborted attempts).

A crash between writing files and committing them leaves orphans under the table location.
They are invisible to readers; this removes those older than a safety window (long enough that
no running attempt can still commit them). Files of a cleanly aborted attempt are deleted at
abort (see ingestion.commit); files after an ambiguous catalog error are left for this.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot


@dataclass(frozen=True)
class OrphanFile:
    """A data file under the table location that no snapshot references."""

    path: str
    size_bytes: int
    modified_ms: int


def list_file_paths(table: Table, snapshot: Snapshot) -> list[str]:
    """The live data and delete files of ``snapshot``, once per manifest entry.

    Read from the manifests: ``inspect.files()`` / ``all_files()`` fail in pyiceberg 0.12 when
    a snapshot holds no file ("Must pass at least one table").
    """
    return [
        entry.data_file.file_path
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    ]


def referenced_paths(table: Table) -> set[str]:
    """Every data and delete file referenced by any snapshot still in the metadata."""
    return {path for s in table.metadata.snapshots for path in list_file_paths(table, s)}


def list_orphan_files(
    table: Table, older_than_s: float, now_s: float | None = None
) -> list[OrphanFile]:
    """Files under ``<location>/data`` that no snapshot references, older than the window.

    Paths are those of the table location's filesystem (no scheme).
    """
    from pyarrow.fs import FileSelector, FileSystem, FileType

    now_s = time.time() if now_s is None else now_s
    filesystem, root = FileSystem.from_uri(f"{table.metadata.location.rstrip('/')}/data")
    referenced = {_strip_scheme(p) for p in referenced_paths(table)}
    orphans = []
    for info in filesystem.get_file_info(FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != FileType.File or info.path in referenced:
            continue
        modified_ms = int(info.mtime.timestamp() * 1000) if info.mtime else 0
        if modified_ms / 1000 <= now_s - older_than_s:
            orphans.append(OrphanFile(info.path, int(info.size or 0), modified_ms))
    return sorted(orphans, key=lambda o: o.path)


def _strip_scheme(path: str) -> str:
    return path.split("://", 1)[1] if "://" in path else path


def remove_orphan_files(table: Table, older_than_s: float = 3 * 24 * 3600) -> list[OrphanFile]:
    """Delete the orphans of :func:`list_orphan_files`; return what was deleted.

    Delivery: safe to run at any time and repeatedly; it never touches a referenced file.
    """
    from pyarrow.fs import FileSystem

    orphans = list_orphan_files(table, older_than_s)
    filesystem, _ = FileSystem.from_uri(table.metadata.location)
    for orphan in orphans:
        filesystem.delete_file(orphan.path)
    return orphans
