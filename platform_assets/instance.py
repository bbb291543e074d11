"""The Dagster instance of a ``DAGSTER_HOME``: its storage created once, opened without creating it.

Dagster's default storage (SQLite files under ``DAGSTER_HOME``: ``history/runs.db``,
``history/runs/index.db``, ``schedules/schedules.db``) is created by whichever process opens the
instance first. Two processes doing so at the same moment race: the first creates the tables and
stamps the schema's head revision, the second finds the tables without a revision yet and stamps
Dagster's last pre-SQLAlchemy-2 revision. The version table then holds two rows, and every later
open fails with alembic's "Version table 'alembic_version' has more than one head present"; or
(seen once in ten cold starts of ``make dev``'s processes) it holds the older revision only, a
schema at head that Dagster takes for one needing migration; or (seen once in a full test run,
four plain opens at once) a file without a version table at all. So the platform's processes
share the storage by two rules:

- :func:`create_storage` is the one creator (``make dev``, before it starts any process that
  opens the instance), under an exclusive lock file so that two creators serialise. It repairs
  what that race (or an older Dagster) left: of two rows it keeps the head (the tables were
  created from the current schema), a storage at an older revision is migrated as ``dagster
  instance migrate`` does (Dagster guards every migration since that revision), and a file with
  no version is stamped by Dagster's constructor (which creates the tables it lacks, or stamps
  the older revision on tables it finds) and then migrated like one. It refuses, in
  one line naming the file to remove and what that loses, a storage it cannot vouch for.
- :func:`open_instance` is every other opener (the ``platform`` CLI, the metrics endpoint): it
  opens an instance whose storage exists and returns None when it does not, never creating it.

An instance configured with other storage (PostgreSQL in ``dagster.yaml``: docs/production.md)
is opened as configured; only Dagster's default SQLite storage has this race.
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dagster import DagsterInstance

LOCK_FILE = ".storage.lock"
STORAGE_KEYS = ("storage", "run_storage", "event_log_storage", "schedule_storage")
"""``dagster.yaml`` keys that configure storage other than the default SQLite files."""


@dataclass(frozen=True)
class StorageFile:
    """One SQLite file of Dagster's default storage, and what removing it loses."""

    path: str
    holds: str


STORAGE_FILES = (
    StorageFile("history/runs.db", "the run history: removing it loses every run"),
    StorageFile(
        "history/runs/index.db",
        "the asset and check history: removing it keeps the runs and their logs",
    ),
    StorageFile(
        "schedules/schedules.db",
        "sensor and schedule state and ticks only: removing it keeps the runs",
    ),
)


class InstanceStorageError(RuntimeError):
    """A Dagster storage file this module will not open; the message names the file to remove."""


def uses_default_storage(home: Path) -> bool:
    """Whether ``home``'s ``dagster.yaml`` leaves storage at Dagster's SQLite default."""
    import yaml

    config_file = home / "dagster.yaml"
    config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else None
    return not (isinstance(config, dict) and any(key in config for key in STORAGE_KEYS))


def storage_exists(home: Path) -> bool:
    """Whether every file of the default storage exists (or storage is configured elsewhere).

    Looked at under a shared lock: a :func:`create_storage` in progress (files there, not yet
    stamped) is waited for."""
    if not uses_default_storage(home):
        return True
    if not home.is_dir():
        return False
    try:
        with _locked(home / LOCK_FILE, fcntl.LOCK_SH):
            return _files_there(home)
    except OSError:  # no lock file can be opened: a read-only home, where nothing creates one
        return _files_there(home)


def _files_there(home: Path) -> bool:
    return all((home / item.path).is_file() for item in STORAGE_FILES)


def open_instance(home: str | Path) -> DagsterInstance | None:
    """The instance of ``home``, or None while its storage has not been created.

    Never creates storage, so it is safe beside any process that does (``make dev``, ``dagster
    dev``); an instance returned must be disposed of (``with`` or ``dispose()``).
    """
    home = Path(home)
    if not storage_exists(home):
        return None
    return DagsterInstance.from_config(str(home))


def create_storage(home: str | Path) -> list[str]:
    """Create ``home``'s storage unless it exists, repairing the two-process race; return what
    was repaired, one line each.

    Idempotent, and serialised by an exclusive lock on ``home/.storage.lock``: two callers at once
    create the storage once.

    Raises:
        InstanceStorageError: a storage file's version table holds several revisions that are
            not the race's signature (or the file is not a database); the message names it.
    """
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home / LOCK_FILE):
        default = uses_default_storage(home)
        repaired = repair_version_rows(home) if default else []
        unstamped = unstamped_files(home) if default else []
        # The constructor creates every file that is missing and stamps an unstamped one: at the
        # head where it creates the tables, at its older revision where they exist already.
        with DagsterInstance.from_config(str(home)) as instance:
            behind = outdated_files(home) if default else []
            if behind:
                instance.upgrade()
        repaired += [f"{path}: had no schema version, stamped by Dagster" for path in unstamped]
        repaired += [f"{path}: migrated from schema version {rev}" for path, rev in behind]
    return repaired


def unstamped_files(home: Path) -> list[Path]:
    """The default storage files that exist without a schema version (a creator that raced
    another, or died, before it stamped one)."""
    return [path for path, _, revisions in _existing_files(home) if not revisions]


def outdated_files(home: Path) -> list[tuple[Path, str]]:
    """The default storage files stamped with an older revision than the schema's head.

    Raises:
        InstanceStorageError: a file stamped with a revision this Dagster does not know (a newer
            Dagster wrote it); the message names the file.
    """
    head = _schema_head()
    behind = []
    for path, item, revisions in _existing_files(home):
        if revisions and revisions != [head]:
            _newest_known(path, item, revisions)  # refuses an unknown one
            behind.append((path, ", ".join(revisions)))
    return behind


def repair_version_rows(home: Path) -> list[str]:
    """Repair each default storage file whose version table holds several rows (the race's two,
    or the race's leftovers after a Dagster upgrade): keep the newest, which the tables were
    created at (an older one is then migrated). Files that do not exist yet are left alone."""
    repaired = []
    for path, item, revisions in _existing_files(home):
        if len(revisions) <= 1:
            continue
        keep = _newest_known(path, item, revisions)
        with contextlib.closing(sqlite3.connect(path)) as connection, connection:
            connection.execute("delete from alembic_version where version_num != ?", (keep,))
        others = ", ".join(r for r in revisions if r != keep)
        repaired.append(f"{path}: kept schema version {keep}, removed {others}")
    return repaired


def _existing_files(home: Path) -> list[tuple[Path, StorageFile, list[str]]]:
    """Each default storage file that exists, with its schema version rows."""
    paths = [(home / item.path, item) for item in STORAGE_FILES]
    return [(path, item, _revisions(path, item)) for path, item in paths if path.is_file()]


def _newest_known(path: Path, item: StorageFile, revisions: list[str]) -> str:
    """The newest of ``revisions`` in the installed Dagster's migrations, walked from its head.

    Raises:
        InstanceStorageError: one of them is not among those migrations; names the file.
    """
    order = _schema_revisions()
    unknown = [revision for revision in revisions if revision not in order]
    if unknown:
        raise InstanceStorageError(
            f"{path} holds schema version(s) {', '.join(unknown)}, unknown to the installed "
            f"Dagster (head {order[0]}; a newer Dagster wrote it?): install that Dagster, or "
            f"remove it ({item.holds}) and start again"
        )
    return min(revisions, key=order.index)


def _revisions(path: Path, item: StorageFile) -> list[str]:
    """The rows of ``path``'s alembic version table ([] before it is stamped)."""
    try:
        with contextlib.closing(sqlite3.connect(path)) as connection:
            tables = connection.execute(
                "select name from sqlite_master where type = 'table' and name = 'alembic_version'"
            ).fetchall()
            if not tables:
                return []
            return [row[0] for row in connection.execute("select version_num from alembic_version")]
    except sqlite3.DatabaseError as exc:
        raise InstanceStorageError(
            f"{path} is not a readable database ({exc}): remove it ({item.holds}) and start again"
        ) from None


def _schema_head() -> str:
    """The head revision of Dagster's storage schema."""
    return _schema_revisions()[0]


def _schema_revisions() -> list[str]:
    """Every revision of Dagster's storage schema, newest (the head) first, from the installed
    Dagster's migrations.

    Read from the script directory Dagster's SQLite storages stamp from
    (``dagster:_core/storage/alembic``, a private location): Dagster has no public API for its
    schema revisions, and this module is the one place that needs them.
    """
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", "dagster:_core/storage/alembic")
    script = ScriptDirectory.from_config(config)
    return [revision.revision for revision in script.walk_revisions("base", "heads")]


@contextlib.contextmanager
def _locked(path: Path, mode: int = fcntl.LOCK_EX) -> Iterator[None]:
    """Hold a lock on ``path``, exclusive unless ``mode`` says shared (released when the process
    dies, too)."""
    with path.open("a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cancel_active_runs(
    instance: DagsterInstance,
    message: str,
    leave_jobs: frozenset[str] = frozenset(),
    starting_timeout_s: float = 30.0,
) -> list[str]:
    """Ask every run of a code location that has not finished to stop as canceled by the user;
    return one line per run. Call it once nothing launches runs any more (``make dev``: its
    daemon has exited), and interrupt the runs' processes after it.

    A queued run is canceled at once. A run in progress is marked canceling, so that when its
    process is interrupted next Dagster ends it as canceled instead of failed ("interrupted
    unexpectedly, no user initiated termination request"). A run still starting (its worker
    loading the definitions) is waited for, up to ``starting_timeout_s``, and then marked
    canceling like one in progress: canceling it at once would not do, because its worker
    decides to start from the copy of the run it read first (a cancel landing after that read
    is overwritten by the run's start, and the interrupt then ends it failed), and a worker
    interrupted while it loads ends a run failed unless the run was already canceled. One that
    has not started by then is canceled (its worker, should it read the run later, does not
    start a canceled run). Runs of ``leave_jobs`` are left alone (a ``platform`` CLI command's
    hold record: its command ends it). Call :func:`cancel_stopped_runs` once the processes are
    gone.
    """
    from dagster import DagsterRunStatus, RunsFilter

    lines = []
    queued = (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED)
    starting: list[str] = []
    statuses = [*queued, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
    for run in instance.get_runs(RunsFilter(statuses=statuses)):
        if run.job_name in leave_jobs:
            continue
        if run.status in queued:
            instance.report_run_canceled(run, message=message)
        elif run.status == DagsterRunStatus.STARTING:
            starting.append(run.run_id)
            continue  # its line once it has started, or was canceled
        else:
            instance.report_run_canceling(run, message=message)
        lines.append(f"{run.job_name} {run.run_id} ({run.status.value}): canceled by the user")
    deadline = time.monotonic() + starting_timeout_s
    while starting:
        for run_id in list(starting):
            now = instance.get_run_by_id(run_id)
            if now is None or now.is_finished:
                starting.remove(run_id)
            elif now.status == DagsterRunStatus.STARTED:
                instance.report_run_canceling(now, message=message)
                lines.append(f"{now.job_name} {run_id} (STARTED): canceled by the user")
                starting.remove(run_id)
            elif time.monotonic() > deadline:  # never started: its worker is gone, or stuck
                instance.report_run_canceled(now, message=message)
                lines.append(f"{now.job_name} {run_id} (STARTING): canceled by the user")
                starting.remove(run_id)
        if starting:
            time.sleep(0.2)
    return lines


def cancel_stopped_runs(
    instance: DagsterInstance, message: str, leave_jobs: frozenset[str] = frozenset()
) -> list[str]:
    """Mark canceled every run that has not finished once the processes that ran them are gone
    (call it only then): those :func:`cancel_active_runs` marked canceling whose process was
    killed before it could say so, and any a sensor launched or queued meanwhile (else the next
    start would launch it). A run whose recorded process (``PROCESS_TAG``) is provably alive, a
    ``dagster job execute`` from another terminal, is left alone, as are ``leave_jobs``.
    Return one line per run."""
    from dagster import DagsterRunStatus, RunsFilter

    from platform_assets.ingest.liveness import PROCESS_TAG, death_evidence

    unfinished = [
        DagsterRunStatus.QUEUED,
        DagsterRunStatus.NOT_STARTED,
        DagsterRunStatus.STARTING,
        DagsterRunStatus.STARTED,
        DagsterRunStatus.CANCELING,
    ]
    lines = []
    for run in instance.get_runs(RunsFilter(statuses=unfinished)):
        tag = run.tags.get(PROCESS_TAG)
        if run.job_name in leave_jobs or (tag and death_evidence(tag, run.run_id) is None):
            continue
        instance.report_run_canceled(run, message=message)
        lines.append(f"{run.job_name} {run.run_id}: canceled (its process had stopped)")
    return lines
