"""Step 5, recover: remove files that no snapshot references (crashed or aborted attempts).

A crash between writing files and committing them leaves orphans under the table's data path. They
are invisible to readers; this removes those older than a safety window (long enough that no running
attempt can still commit them, see ``ingestion.ops.maintenance``). Files of a cleanly aborted
attempt are deleted at abort (see ingestion.pipeline.commit); files after an ambiguous catalog error
are left for this.

The table's references and the filesystem listing may spell one file differently
(``file:/x`` and ``/x``; ``s3a://b/k`` and ``b/k``; an ``abfss://`` URI and a container path).
Both sides are normalised the same way (:func:`normalize_path`), and removal is refused when
the referenced files are not found in the listing (R44): a file is deleted only when it is
provably unreferenced.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ingestion import exceptions

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

# Refuse removal when fewer of the referenced files than this are found in the listing.
MIN_REFERENCED_LISTED = 0.5
_CONTAINER_SCHEMES = {"abfs", "abfss", "wasb", "wasbs"}  # container@account.host/path
_PATH_ONLY_SCHEMES = {"", "file", "hdfs", "viewfs"}  # the authority is not part of the path


@dataclass(frozen=True)
class OrphanFile:
    """A data file under the table's data path that no snapshot references."""

    path: str
    size_bytes: int
    modified_ms: int


def normalize_path(path: str) -> str:
    """One spelling per file for comparing references with a listing: no scheme, no host for
    local and HDFS paths, the container for Azure, the bucket for object stores.

    Example:
        >>> [normalize_path(p) for p in ("file:/w/t/a.parquet", "file:///w/t/a.parquet",
        ...                              "/w/t//a.parquet", "hdfs://nn:8020/w/t/a.parquet")]
        ['/w/t/a.parquet', '/w/t/a.parquet', '/w/t/a.parquet', '/w/t/a.parquet']
        >>> [normalize_path(p) for p in ("s3a://b/t/a.parquet", "s3://b/t/a.parquet",
        ...                              "abfss://c@acct.dfs.core.windows.net/t/a.parquet")]
        ['b/t/a.parquet', 'b/t/a.parquet', 'c/t/a.parquet']
    """
    parts = urlsplit(path)
    scheme = parts.scheme.lower() if len(parts.scheme) > 1 else ""  # "C:" is a drive letter
    if scheme in _PATH_ONLY_SCHEMES:
        spelled = parts.path if scheme else path
    elif scheme in _CONTAINER_SCHEMES:
        spelled = parts.netloc.split("@", 1)[0] + parts.path
    else:
        spelled = parts.netloc + parts.path
    return re.sub("/{2,}", "/", spelled)


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


def check_listing_matches(
    referenced: set[str], listed: set[str], data_path: str, table_name: str
) -> None:
    """Refuse when the normalised references and listing do not overlap enough (pure).

    Raises:
        OrphanRemovalRefusedError: both are non-empty and fewer than
            :data:`MIN_REFERENCED_LISTED` of the referenced files are in the listing.
    """
    if not referenced or not listed:
        return
    found = len(referenced & listed)
    if found / len(referenced) >= MIN_REFERENCED_LISTED:
        return
    raise exceptions.OrphanRemovalRefusedError(
        f"table {table_name}: refusing to remove orphan files: only {found} of "
        f"{len(referenced)} referenced files appear in the listing of {data_path}, so the "
        "table and the filesystem spell paths differently (e.g. "
        f"{sorted(referenced - listed)[0]!r} referenced, {sorted(listed)[0]!r} listed). "
        "Nothing was deleted; point the table's location or write.data.path at the spelling "
        "the filesystem lists."
    )


def table_filesystem(table: Table, uri: str) -> tuple[Any, str]:
    """The pyarrow filesystem of ``uri`` and the path in it, configured by the table's FileIO
    properties (an S3 endpoint, credentials, region) as its reads and writes are; pyarrow's
    defaults for ``uri`` when the table's FileIO is not pyarrow's."""
    from pyarrow.fs import FileSystem
    from pyiceberg.io.pyarrow import PyArrowFileIO

    if isinstance(table.io, PyArrowFileIO):
        scheme, netloc, path = PyArrowFileIO.parse_location(uri, table.io.properties)
        return table.io.fs_by_scheme(scheme, netloc), path
    return FileSystem.from_uri(uri)


def list_orphan_files(
    table: Table, older_than_s: float, now_s: float | None = None, keep: Collection[str] = ()
) -> list[OrphanFile]:
    """Files under the table's data path that no snapshot references, older than the window.

    Paths are those of the data path's filesystem (as listed). ``keep``: paths that count as
    referenced though no snapshot of this table names them (a quarantine table's files that a
    data commit names and the sync has not applied yet, ingestion.quarantine.sync).

    Raises:
        OrphanRemovalRefusedError: the references and the listing do not match
            (:func:`check_listing_matches`).
    """
    from pyarrow.fs import FileSelector, FileType

    now_s = time.time() if now_s is None else now_s
    data_path = table.location_provider().data_path
    filesystem, root = table_filesystem(table, data_path)
    selector = FileSelector(root, recursive=True, allow_not_found=True)
    files = [i for i in filesystem.get_file_info(selector) if i.type == FileType.File]
    listed = {normalize_path(info.path): info for info in files}
    referenced = {normalize_path(p) for p in referenced_paths(table)}
    check_listing_matches(referenced, set(listed), data_path, ".".join(table.name()))
    referenced |= {normalize_path(p) for p in keep}
    orphans = []
    for path, info in listed.items():
        modified_ms = int(info.mtime.timestamp() * 1000) if info.mtime else 0
        if path not in referenced and modified_ms / 1000 <= now_s - older_than_s:
            orphans.append(OrphanFile(info.path, int(info.size or 0), modified_ms))
    return sorted(orphans, key=lambda o: o.path)


def remove_orphan_files(
    table: Table, older_than_s: float = 3 * 24 * 3600, keep: Collection[str] = ()
) -> list[OrphanFile]:
    """Delete the orphans of :func:`list_orphan_files` (never a path in ``keep``); return what
    was deleted.

    Delivery: safe to run at any time and repeatedly; it never touches a referenced file, and
    deletes nothing when the references and the listing do not match (it raises instead).
    """
    orphans = list_orphan_files(table, older_than_s, keep=keep)
    filesystem, _ = table_filesystem(table, table.location_provider().data_path)
    for orphan in orphans:
        filesystem.delete_file(orphan.path)
    return orphans
