"""The quarantine table follows the data table, so a plain reader sees each dead letter once.

pyiceberg 0.12 cannot commit two tables atomically, so one must lead. The data table leads:

1. A run's tasks write the quarantine files (durable, invisible). The data commit, the
   compare-and-set on the group's offsets (rule 1), names them in ``kafka.quarantine-files``:
   the offsets move past a bad record only in the commit that names its durable file.
2. Then :func:`sync_quarantine` replays the data table's commits onto the quarantine table, in
   lineage order, one quarantine commit per commit that needs one. The quarantine table records,
   in its own table properties (they outlive snapshot expiry), the data table's uuid and the
   sequence number, commit id and offsets of the last commit it reflects. Applying a commit
   deletes the quarantine rows at or after the offset the commit started from (or moved back
   to) and adds its files, in one transaction: a delete, an append and the new state, with
   pyiceberg's retry off. Its compare-and-set is on the quarantine table's head; the loser
   reloads both tables and plans again.

Why a plain reader is right, in every case:

- Crash before the data commit, or a run losing a race (R7) or a paused zombie waking after a
  newer commit (R8): no commit names its files, so they never reach the quarantine table; the
  loser deletes them, a crash leaves orphans. Nothing to filter, whatever the losers' ranges.
- Crash after the data commit (R4): the quarantine table is one commit behind until the next
  sync; every run syncs, an idle one too, before it copies dead letters or mirrors the group.
  A reader may miss the newest commit's dead letters for that long; it never sees a record
  twice or one from a range the table has not committed.
- Two syncers at once (a run and a reset, or a zombie): both replay the same lineage; the
  quarantine head moved under the second, which replans and finds nothing left. A syncer that
  read an older lineage applies a prefix of it, which is valid; a commit it applies that a
  rollback then removed is undone by the next sync (see the rewinds). The quarantine table is
  read before the data table: barring a rollback in between, every commit it reflects is in
  the lineage read after it.
- Replays (R5): a replayed data commit adds no commit; a replayed sync finds its state done.
- Rewinds: a backward reset or a rollback (R32) leaves quarantine rows beyond the table's
  offsets; the next sync deletes rows at or after the offsets the table moved back to, before
  the re-read range's files are added (or at once when no commit follows). A reset syncs right
  after its data commit; if it fails in between, the next run's sync does it.
- Snapshot expiry: the state is a table property, not a snapshot; commits newer than the
  recorded sequence number are found in what is left of the lineage. If the commit before them
  expired too, rows are deleted only beyond the newest commit's offsets.

Why not the quarantine table first (a run replacing the rows of its ranges before its data
commit): a loser's replacement can land after the winner's data commit and delete the winner's
rows of a committed range (checking the data table first is check-then-act), and a crashed
run's rows stay visible for an uncommitted range until a later run covers it, for good if a
forward reset skips it. Following the data table, nothing a loser does reaches a reader.

Two duties for maintenance: snapshot expiry on the data table must keep
:func:`unsynced_snapshot_ids` (a commit that is expired before it is synced takes the only
record of its quarantine files with it), and orphan-file removal on a quarantine table must not
delete files that a data commit names and the sync has not applied yet. A quarantine table
written before this design (no recorded state) keeps its rows; syncing adds the files of the
commits that name them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ingestion import exceptions
from ingestion.kafka.ranges import Key
from ingestion.pipeline.commit import commit_view, load_table_with_retry
from ingestion.quarantine.plan import (
    SourceCommit,
    Step,
    decode_file_list,
    encode_file_list,
    plan_sync,
    rows_at_or_after,
)
from ingestion.table.offsets import (
    CLUSTER_ID,
    COMMIT_ID,
    FAILOVER_TO,
    GROUP_ID,
    OFFSETS_PREFIX,
    PIPELINE,
    decode_offsets,
    encode_offsets,
    flatten,
    iter_ancestry,
    snapshot_properties,
)
from ingestion.table.route import route_of
from ingestion.table.schema import PRIMARY, cluster_condition, has_cluster_column

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

    from ingestion.spec.pipeline import PipelineSpec

QUARANTINE_FILES = "kafka.quarantine-files"  # data commit: the quarantine files it names
FOLLOWS = "kafka.quarantine.follows"  # quarantine table: the data table's uuid
SYNCED_SEQUENCE = "kafka.quarantine.synced-sequence"  # ... the last reflected commit's
SYNCED_COMMIT = "kafka.quarantine.synced-commit"
SYNCED_OFFSETS = "kafka.quarantine.synced-offsets"
SYNCED_CLUSTER = "kafka.quarantine.synced-cluster"  # ... its cluster id (a cut needs the same)


def quarantine_properties(quarantine: Table, files: list[DataFile]) -> dict[str, str]:
    """The data commit's property naming ``files`` (none without files)."""
    if not files:
        return {}
    paths = [f.file_path for f in files]
    return {QUARANTINE_FILES: encode_file_list(quarantine.metadata.location, paths)}


def read_source_commits(
    table: Table, after: int, location: str
) -> tuple[list[SourceCommit], dict[Key, int] | None, SourceCommit | None]:
    """The data table's commits with a sequence number above ``after`` (oldest first), the
    offsets before them (``{}``: none, None: expired) and its newest commit."""
    newer: list[SourceCommit] = []
    head: SourceCommit | None = None
    last: Snapshot | None = None
    for snapshot in iter_ancestry(table):
        last = snapshot
        commit = _source_commit(snapshot, location)
        if commit is None:
            continue
        head = head or commit
        if commit.sequence <= after:
            return newer[::-1], flatten(commit.offsets), head
        newer.append(commit)
    # Expiry clears the parent id of the oldest snapshot it keeps: only the table's first
    # snapshot (sequence number 1) proves there was nothing before.
    complete = last is None or (last.sequence_number or 0) <= 1
    return newer[::-1], ({} if complete else None), head


def _source_commit(snapshot: Snapshot, location: str) -> SourceCommit | None:
    properties = snapshot_properties(snapshot)
    key = OFFSETS_PREFIX + properties.get(GROUP_ID, "")
    if COMMIT_ID not in properties or key not in properties:
        return None  # maintenance and other writers' snapshots
    return SourceCommit(
        snapshot.sequence_number or 0,
        properties[COMMIT_ID],
        decode_offsets(properties[key]),
        decode_file_list(location, properties.get(QUARANTINE_FILES, "[]")),
        properties.get(CLUSTER_ID, ""),
        (route_of(properties) or {}).get(FAILOVER_TO, PRIMARY),
    )


def unsynced_snapshot_ids(table: Table, quarantine: Table) -> set[int]:
    """Snapshots of ``table`` that snapshot expiry must keep (rule 7's kin): while a commit
    still has to reach the quarantine table, the path from the current snapshot back to the
    commit before it. Expiring one would lose the files only that commit names. Empty when the
    quarantine table is up to date (the usual case: every run syncs)."""
    if quarantine.metadata.properties.get(FOLLOWS, str(table.metadata.table_uuid)) != str(
        table.metadata.table_uuid
    ):  # it follows a dropped table: its state says nothing here, keep every snapshot
        return {s.snapshot_id for s in table.metadata.snapshots}
    location = quarantine.metadata.location
    state = quarantine.metadata.properties
    after = int(state.get(SYNCED_SEQUENCE, "0"))
    synced = flatten(decode_offsets(state.get(SYNCED_OFFSETS, "{}")))
    newer, before, head = read_source_commits(table, after, location)
    labelled = has_cluster_column(quarantine)
    steps = plan_sync(synced, newer, before, head, state.get(SYNCED_CLUSTER), labelled)
    if not steps or not newer:  # nothing to replay (a truncation needs the current snapshot)
        return set()
    first = steps[0].commit.sequence
    path: set[int] = set()
    for snapshot in iter_ancestry(table):
        path.add(snapshot.snapshot_id)
        commit = _source_commit(snapshot, location)
        if commit is not None and commit.sequence < first:
            break
    return path


def named_quarantine_files(table: Table, quarantine: Table) -> set[str]:
    """Every quarantine file a snapshot of ``table`` still in its metadata names: orphan removal
    on the quarantine table keeps them (a commit not synced yet names files no quarantine
    snapshot references; expiry keeps such commits, :func:`unsynced_snapshot_ids`). Files of
    commits already synced are referenced anyway or were cut by a rewind: keeping them until
    their data snapshot expires costs nothing."""
    location = quarantine.metadata.location
    return {
        path
        for snapshot in table.metadata.snapshots
        for path in decode_file_list(
            location, snapshot_properties(snapshot).get(QUARANTINE_FILES, "[]")
        )
    }


def sync_quarantine(catalog: Catalog, spec: PipelineSpec, max_conflicts: int = 5) -> int:
    """Bring the pipeline's quarantine table up to its data table; return the commits made.

    Delivery: idempotent and safe to run at any time, from any process, concurrently (see the
    module docstring). Does nothing without a quarantine table.

    Raises:
        QuarantineSyncError: a file a commit names cannot be read, the data table was
            recreated, or the quarantine table kept changing; the data commits stand and the
            next sync starts where this one stopped.
    """
    from pyiceberg.exceptions import CommitFailedException

    if not catalog.table_exists(spec.quarantine_table):
        return 0
    made = conflicts = 0
    while True:
        quarantine = load_table_with_retry(catalog, spec.quarantine_table)  # first: see above
        table = load_table_with_retry(catalog, spec.table)
        follows = str(table.metadata.table_uuid)
        if table.metadata.format_version < 2:  # v1 snapshots have no sequence numbers
            raise exceptions.QuarantineSyncError(
                f"pipeline {spec.name!r}: table {spec.table} is an Iceberg v1 table; the "
                "quarantine sync needs v2 (upgrade it: format-version 2)"
            )
        state = quarantine.metadata.properties
        if state.get(FOLLOWS, follows) != follows:
            raise exceptions.QuarantineSyncError(
                f"pipeline {spec.name!r}: quarantine table {spec.quarantine_table} follows "
                f"table uuid {state[FOLLOWS]}, but {spec.table} is now {follows} (dropped and "
                f"recreated); move {spec.quarantine_table} aside, then run again"
            )
        synced = flatten(decode_offsets(state.get(SYNCED_OFFSETS, "{}")))
        after = int(state.get(SYNCED_SEQUENCE, "0"))
        newer, before, head = read_source_commits(table, after, quarantine.metadata.location)
        labelled = has_cluster_column(quarantine)
        steps = plan_sync(synced, newer, before, head, state.get(SYNCED_CLUSTER), labelled)
        if not steps:
            return made
        try:
            apply_step(quarantine, steps[0], follows, spec.name)
        except CommitFailedException as exc:  # another syncer moved the head: plan again
            conflicts += 1
            if conflicts >= max_conflicts:
                raise exceptions.QuarantineSyncError(
                    f"pipeline {spec.name!r}: quarantine table {spec.quarantine_table} kept "
                    f"changing; gave up after {conflicts} attempts ({made} commits made)"
                ) from exc
            time.sleep(min(2.0, 0.1 * 2**conflicts))
            continue
        except OSError as exc:
            raise exceptions.QuarantineSyncError(
                f"pipeline {spec.name!r}: commit {steps[0].commit.commit_id} of {spec.table} "
                f"names quarantine files that cannot be read ({exc}); restore them, the next "
                "run syncs again"
            ) from exc
        made += 1


def apply_step(quarantine: Table, step: Step, follows: str, pipeline: str) -> None:
    """One transaction: delete rows at or after the cuts, add the files, record the state.

    Raises:
        CommitFailedException: the quarantine table's head moved since ``quarantine`` was
            loaded (pyiceberg's retry is off): plan again.
    """
    import warnings

    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    metadata, io = quarantine.metadata, quarantine.io
    files = [parquet_file_to_data_file(io, metadata, path) for path in step.commit.files]
    summary = {COMMIT_ID: step.commit.commit_id, PIPELINE: pipeline}
    state = {
        FOLLOWS: follows,
        SYNCED_SEQUENCE: str(step.commit.sequence),
        SYNCED_COMMIT: step.commit.commit_id,
        SYNCED_OFFSETS: encode_offsets(step.commit.offsets),
    }
    if step.commit.cluster_id:
        state[SYNCED_CLUSTER] = step.commit.cluster_id
    with commit_view(quarantine).transaction() as transaction, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Delete operation did not match any records")
        if step.cuts:  # of the rows read on the cluster the cuts refer to (identity naming)
            where = cluster_condition(quarantine, step.commit.cluster or None) or ""
            transaction.delete(
                f"({rows_at_or_after(step.cuts)}){where}", snapshot_properties=summary
            )
        # Always a snapshot: its assertion on the head is the compare-and-set of the state.
        with transaction.update_snapshot(snapshot_properties=summary).fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)
        transaction.set_properties(state)
