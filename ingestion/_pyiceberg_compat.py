"""The one place that uses private pyiceberg APIs. Written against pyiceberg 0.12.0.

- :func:`parquet_writer_kwargs` (the executor tasks' rolling writer, ingestion.task.writer) uses
  ``pyiceberg.io.pyarrow._get_parquet_writer_kwargs``: the Parquet settings pyiceberg derives
  from the table properties (codec, level, page and dictionary sizes), so that our files are
  written exactly as pyiceberg's own would be. The rest of that writer is public API.
- :func:`replace_files` (compaction) subclasses ``pyiceberg.table.update.snapshot._OverwriteFiles``:
  pyiceberg 0.12 has no public way to commit a ``replace`` snapshot (files rewritten, rows
  unchanged, as Spark's ``rewrite_data_files`` writes); its summary code raises "Operation not
  implemented: replace". The subclass builds the summary as an overwrite's (the same counts
  and totals) and records it as ``replace``. ``tests/ingestion/test_pyiceberg_compat.py`` fails
  when pyiceberg learns to write ``replace`` itself: then switch to its public call.
- :func:`overwrite_files` (``mode: upsert``'s copy-on-write commit) and :func:`replace_files`
  drop, from the manifests the new snapshot carries over, those left with no live file.
  pyiceberg 0.12's ``_OverwriteFiles`` keeps every manifest of the parent that holds none of
  the files it deletes, also one whose entries are all deleted (the record of an earlier
  overwrite's deletes): one more per overwrite, forever, and every scan plans through them all
  (measured by bench/upsert.py: 223 manifests for 8 live data files after 219 upsert commits,
  each run slower than the last). Its own fast append, and Java's Iceberg, drop them.
  ``tests/ingestion/test_pyiceberg_compat.py`` fails when pyiceberg's overwrite drops them
  itself: then use ``update_snapshot().overwrite()`` again.

Check this module first when upgrading pyiceberg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.table import Transaction
    from pyiceberg.table.update.snapshot import _OverwriteFiles


def parquet_writer_kwargs(properties: dict[str, str]) -> dict[str, Any]:
    """``pyarrow.parquet.ParquetWriter`` keyword arguments for a table's properties.

    Example:
        >>> kwargs = parquet_writer_kwargs({"write.parquet.compression-codec": "zstd"})
        >>> kwargs["compression"]
        'zstd'
    """
    from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs

    return _get_parquet_writer_kwargs(properties)


def replace_files(
    transaction: Transaction, io: FileIO, snapshot_properties: dict[str, str]
) -> _OverwriteFiles:
    """A snapshot producer of ``transaction`` that commits a ``replace`` snapshot: use its
    ``delete_data_file`` and ``append_data_file`` (the same rows in new files), as a context
    manager that commits on a clean exit.

    Delivery: as pyiceberg's overwrite, one snapshot when the transaction commits, none if it
    fails; the caller checks that the files hold the same rows (a ``replace`` promises it).
    """
    from pyiceberg.table.snapshots import Operation, Summary

    class _ReplaceFiles(_overwrite_class()):  # type: ignore[misc]
        def _summary(self, snapshot_properties: dict[str, str] | None = None) -> Summary:
            summary = super()._summary(snapshot_properties or {})  # counted as an overwrite
            return Summary(Operation.REPLACE, **summary.additional_properties)

    return _ReplaceFiles(
        operation=Operation.OVERWRITE,
        transaction=transaction,
        io=io,
        snapshot_properties=snapshot_properties,
    )


def overwrite_files(
    transaction: Transaction, io: FileIO, snapshot_properties: dict[str, str]
) -> _OverwriteFiles:
    """pyiceberg's overwrite of ``transaction`` (``delete_data_file``, ``append_data_file``; a
    context manager that commits on a clean exit) that carries no manifest without a live
    file into the new snapshot (see the module docstring).

    Delivery: as pyiceberg's overwrite: one snapshot when the transaction commits, none if it
    fails.
    """
    from pyiceberg.table.snapshots import Operation

    return _overwrite_class()(
        operation=Operation.OVERWRITE,
        transaction=transaction,
        io=io,
        snapshot_properties=snapshot_properties,
    )


def _overwrite_class() -> type[_OverwriteFiles]:
    """``_OverwriteFiles`` dropping the parent's manifests that hold no live file."""
    from pyiceberg.manifest import ManifestFile
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class _DropDeadManifests(_OverwriteFiles):
        def _existing_manifests(self) -> list[ManifestFile]:
            return [
                manifest
                for manifest in super()._existing_manifests()
                if manifest.has_added_files()
                or manifest.has_existing_files()
                or manifest.added_snapshot_id == self._snapshot_id
            ]

    return _DropDeadManifests
