"""The Dagster instance of a ``DAGSTER_HOME``: its storage created once, opened without creating it.

Dagster's default storage (SQLite files under ``DAGSTER_HOME``: ``history/runs.db``,
``history/runs/index.db``, ``schedules/schedules.db``) is created by whichever process opens the
instance first. Two processes doing so at the same moment race: the first creates the tables and
stamps the schema's head revision, the second finds the tables without a revision yet and stamps
Dagster's last pre-SQLAlchemy-2 revision. The version table then holds two rows, and every later
open fails with alembic's "Version table 'alembic_version' has more than one head present"; or
(seen once in ten cold starts of ``make dev``'s processes) it holds the older revision only, a
schema at head that Dagster takes for one needing migration. So the platform's processes share
the storage by two rules:

- :func:`create_storage` is the one creator (``make dev``, before it starts any process that
  opens the instance), under an exclusive lock file so that two creators serialise. It repairs
  what that race (or an older Dagster) left: of two rows it keeps the head (the tables were
  created from the current schema), and a storage at an older revision is migrated as ``dagster
  instance migrate`` does (Dagster guards every migration since that revision). It refuses, in
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
    """Whether every file of the default storage exists (or storage is configured elsewhere)."""
    if not uses_default_storage(home):
        return True
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
        # The constructor creates every storage that is missing.
        with DagsterInstance.from_config(str(home)) as instance:
            behind = outdated_files(home) if default else []
            if behind:
                instance.upgrade()
                repaired += [f"{path}: migrated from schema version {rev}" for path, rev in behind]
    return repaired


def outdated_files(home: Path) -> list[tuple[Path, str]]:
    """The default storage files stamped with a revision other than the schema's head."""
    head = _schema_head()
    behind = []
    for item in STORAGE_FILES:
        path = home / item.path
        revisions = _revisions(path, item) if path.is_file() else []
        if revisions and revisions != [head]:
            behind.append((path, ", ".join(revisions)))
    return behind


def repair_version_rows(home: Path) -> list[str]:
    """Repair each default storage file whose version table holds the race's two rows (the
    schema's head among them): keep the head. Files that do not exist yet are left alone."""
    head = _schema_head()
    repaired = []
    for item in STORAGE_FILES:
        path = home / item.path
        if not path.is_file():
            continue
        revisions = _revisions(path, item)
        if len(revisions) <= 1:
            continue
        if head not in revisions:
            raise InstanceStorageError(
                f"{path} holds {len(revisions)} schema versions ({', '.join(revisions)}), "
                f"none the installed Dagster's ({head}): remove it ({item.holds}) and start again"
            )
        with contextlib.closing(sqlite3.connect(path)) as connection, connection:
            connection.execute("delete from alembic_version where version_num != ?", (head,))
        others = ", ".join(r for r in revisions if r != head)
        repaired.append(f"{path}: kept schema version {head}, removed {others}")
    return repaired


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
    """The head revision of Dagster's storage schema, from the installed Dagster's migrations.

    Read from the script directory Dagster's SQLite storages stamp from
    (``dagster:_core/storage/alembic``, a private location): Dagster has no public API for its
    schema revision, and this module is the one place that needs it.
    """
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", "dagster:_core/storage/alembic")
    head = ScriptDirectory.from_config(config).get_current_head()
    if head is None:
        raise InstanceStorageError("the installed Dagster's storage schema has no head revision")
    return head


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (released when the process dies, too)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cancel_active_runs(
    instance: DagsterInstance, message: str, leave_jobs: frozenset[str] = frozenset()
) -> list[str]:
    """Ask every run of a code location that has not finished to stop as canceled by the user;
    return one line per run.

    A queued run is canceled at once; a run in progress is marked canceling, so that when its
    process is interrupted next (``make dev`` stopping ``dagster dev``) Dagster ends it as
    canceled instead of failed ("interrupted unexpectedly, no user initiated termination
    request"). Runs of ``leave_jobs`` are left alone (a ``platform`` CLI command's hold record:
    its command ends it). Call :func:`cancel_stopped_runs` once the processes are gone.
    """
    from dagster import DagsterRunStatus, RunsFilter

    lines = []
    queued = (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED)
    running = (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED)
    for run in instance.get_runs(RunsFilter(statuses=[*queued, *running])):
        if run.job_name in leave_jobs:
            continue
        if run.status in queued:
            instance.report_run_canceled(run, message=message)
        else:
            instance.report_run_canceling(run, message=message)
        lines.append(f"{run.job_name} {run.run_id} ({run.status.value}): canceled by the user")
    return lines


def cancel_stopped_runs(instance: DagsterInstance, message: str) -> list[str]:
    """Mark canceled the runs :func:`cancel_active_runs` asked to stop whose process ended
    before it could say so (killed after the grace period); call it only once every process that
    could run them is gone. Return one line per run."""
    from dagster import DagsterRunStatus, RunsFilter

    lines = []
    for run in instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.CANCELING])):
        instance.report_run_canceled(run, message=message)
        lines.append(f"{run.job_name} {run.run_id}: canceled (its process had stopped)")
    return lines
