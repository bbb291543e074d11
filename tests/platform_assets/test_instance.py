"""The Dagster instance's storage (platform_assets/instance.py), on Dagster's real SQLite storage:
created once however many processes ask at the same moment, never created by an opener, the
race's leftovers repaired and anything else refused by name.

The broken storages below are written as the race leaves them (a second schema version row, or
the older version alone) on top of a real storage: a race between processes cannot be driven
into one outcome on demand. ``test_plain_opens_at_once_break_what_create_storage_keeps_whole``
shows the race itself with Dagster's own constructor.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sqlite3
import threading
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest
from dagster import DagsterEvent, DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus

from platform_assets.cli.actions import CLI_ACTION_JOB
from platform_assets.instance import (
    STORAGE_FILES,
    InstanceStorageError,
    _schema_revisions,
    cancel_active_runs,
    cancel_stopped_runs,
    create_storage,
    open_instance,
    storage_exists,
)

HEAD = "29b539ebc72a"  # the installed Dagster 1.13's storage schema head (constraints.txt)
OLDER = "5771160a95ad"  # the revision a second creator stamps (Dagster's last pre-SQLAlchemy-2)


def versions(home: Path) -> dict[str, list[str]]:
    """Each storage file's schema version rows (none for a file without a version table, as
    the race can leave it); a file no opener created is left out (every opener of a round can
    fail before it gets there: seen once in a full run)."""
    found = {}
    for item in STORAGE_FILES:
        if not (home / item.path).is_file():
            continue
        with contextlib.closing(sqlite3.connect(home / item.path)) as connection:
            table = connection.execute(
                "select 1 from sqlite_master where type = 'table' and name = 'alembic_version'"
            ).fetchall()
            query = "select version_num from alembic_version"
            rows = connection.execute(query).fetchall() if table else []
        found[item.path] = [row[0] for row in rows]
    return found


def one_head(home: Path) -> dict[str, list[str]]:
    return {item.path: [HEAD] for item in STORAGE_FILES}


def stamp(path: Path, *revisions: str) -> None:
    """Replace ``path``'s schema version rows with ``revisions``."""
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("delete from alembic_version")
        for revision in revisions:
            connection.execute("insert into alembic_version values (?)", (revision,))


def test_create_storage_creates_each_file_once_with_the_head(tmp_path: Path) -> None:
    assert create_storage(tmp_path) == []
    assert versions(tmp_path) == one_head(tmp_path)
    assert create_storage(tmp_path) == []  # idempotent
    instance = open_instance(tmp_path)
    assert instance is not None
    instance.dispose()


def test_open_instance_never_creates_storage(tmp_path: Path) -> None:
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    assert open_instance(tmp_path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [".storage.lock", "dagster.yaml"]
    # Storage configured elsewhere (PostgreSQL in production) is opened as configured: its
    # files are not under DAGSTER_HOME.
    (tmp_path / "dagster.yaml").write_text("storage:\n  postgres: {}\n")
    assert storage_exists(tmp_path)


def _create(home: str, barrier: Barrier) -> None:
    barrier.wait()
    create_storage(home)


def _open_plainly(home: str, barrier: Barrier) -> None:
    barrier.wait()
    with contextlib.suppress(Exception):  # the race may make one of them fail outright
        DagsterInstance.from_config(home).dispose()


def start_at_once(target: Callable[[str, Barrier], None], home: Path, processes: int) -> None:
    """Run ``target(home, barrier)`` in ``processes`` forked processes released together."""
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    context = multiprocessing.get_context("fork")  # Dagster is imported once, here
    barrier = context.Barrier(processes)
    started = [context.Process(target=target, args=(str(home), barrier)) for _ in range(processes)]
    for process in started:
        process.start()
    for process in started:
        process.join(120)
        assert process.exitcode == 0


RACE_ROUNDS = 10


def test_plain_opens_at_once_break_what_create_storage_keeps_whole(tmp_path: Path) -> None:
    """Dagster's constructor, called by four processes at the same moment on an empty home,
    leaves a storage file that is not at one head (in most rounds here: the test waits for the
    first of up to ten); :func:`create_storage` repairs it, creates any file the round left
    missing, and from as many processes at once leaves one head every round."""
    for attempt in range(RACE_ROUNDS):
        broken = tmp_path / f"plain-{attempt}"
        start_at_once(_open_plainly, broken, 4)
        if any(rows != [HEAD] for rows in versions(broken).values()):  # a file to repair
            break
    else:
        raise AssertionError(f"{RACE_ROUNDS} rounds of plain opens at once never raced")
    assert create_storage(broken)  # repaired
    assert versions(broken) == one_head(broken)
    for attempt in range(3):
        home = tmp_path / f"locked-{attempt}"
        start_at_once(_create, home, 4)
        assert versions(home) == one_head(home)


def test_two_version_rows_are_repaired_keeping_the_head(tmp_path: Path) -> None:
    create_storage(tmp_path)
    schedules = tmp_path / "schedules" / "schedules.db"
    stamp(schedules, HEAD, OLDER)  # what .platform held after the race on a fresh machine
    with pytest.raises(Exception, match="more than one head"):
        DagsterInstance.from_config(str(tmp_path))
    repaired = create_storage(tmp_path)
    assert repaired == [f"{schedules}: kept schema version {HEAD}, removed {OLDER}"]
    assert versions(tmp_path) == one_head(tmp_path)


def test_the_older_version_alone_is_migrated(tmp_path: Path) -> None:
    create_storage(tmp_path)
    runs = tmp_path / "history" / "runs.db"
    stamp(runs, OLDER)
    assert create_storage(tmp_path) == [f"{runs}: migrated from schema version {OLDER}"]
    assert versions(tmp_path) == one_head(tmp_path)


def test_a_file_without_a_version_is_completed_stamped_and_reported(tmp_path: Path) -> None:
    """The race's third leftover: a file whose version table is missing (its tables there or
    not). Dagster's constructor creates the tables it lacks and stamps the head, or stamps its
    older revision on the tables it finds, which is then migrated; the repair says so."""
    create_storage(tmp_path)
    runs = tmp_path / "history" / "runs.db"
    with contextlib.closing(sqlite3.connect(runs)) as connection, connection:
        connection.execute("drop table alembic_version")
    schedules = tmp_path / "schedules" / "schedules.db"
    schedules.write_bytes(b"")  # what an opener's first connect leaves: a database of no tables
    assert create_storage(tmp_path) == [
        f"{runs}: had no schema version, stamped by Dagster",
        f"{schedules}: had no schema version, stamped by Dagster",
        f"{runs}: migrated from schema version {OLDER}",
    ]
    assert versions(tmp_path) == one_head(tmp_path)
    instance = open_instance(tmp_path)
    assert instance is not None
    with instance:
        assert instance.get_runs() == []
        assert instance.all_instigator_state() == []


def test_the_race_after_a_dagster_upgrade_keeps_the_newest_and_migrates(tmp_path: Path) -> None:
    """Two known rows, neither the head (the race, then a newer Dagster installed): the newer
    row is kept and the storage migrated, the run history with it."""
    create_storage(tmp_path)
    newer, older = _schema_revisions()[1:3]
    runs = tmp_path / "history" / "runs.db"
    stamp(runs, older, newer)
    repaired = create_storage(tmp_path)
    assert repaired == [
        f"{runs}: kept schema version {newer}, removed {older}",
        f"{runs}: migrated from schema version {newer}",
    ]
    assert versions(tmp_path) == one_head(tmp_path)


def test_a_storage_it_cannot_vouch_for_is_refused_naming_the_file(tmp_path: Path) -> None:
    create_storage(tmp_path)
    schedules = tmp_path / "schedules" / "schedules.db"
    stamp(schedules, "aaaaaaaaaaaa", HEAD)  # one of them unknown to this Dagster
    with pytest.raises(InstanceStorageError) as refused:
        create_storage(tmp_path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{schedules} holds schema version(s) aaaaaaaaaaaa, unknown"), message
    assert "remove it (sensor and schedule state and ticks only: removing it keeps the runs)" in (
        message
    )
    stamp(schedules, "ffffffffffff")  # alone: a newer Dagster wrote it
    with pytest.raises(InstanceStorageError, match="ffffffffffff, unknown to the installed"):
        create_storage(tmp_path)
    stamp(schedules, HEAD)
    runs = tmp_path / "history" / "runs.db"
    runs.write_bytes(b"not a database, but long enough to be read as a header" * 20)
    with pytest.raises(InstanceStorageError, match=f"{runs} is not a readable database"):
        create_storage(tmp_path)


def test_stopping_cancels_every_run_but_a_cli_hold(tmp_path: Path) -> None:
    """``make dev``'s stop: runs not started yet canceled at once, runs in progress marked
    canceling and, once their processes are gone, canceled; a run still starting waited for
    (its worker decides to start from the run it read, which a cancel does not change) and
    marked canceling once started, or canceled when it never starts; a CLI command's hold record
    left to its command."""
    create_storage(tmp_path)
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        queued = instance.add_run(
            DagsterRun(job_name="stream_worker", status=DagsterRunStatus.NOT_STARTED)
        )
        starts = instance.add_run(
            DagsterRun(job_name="__ASSET_JOB", status=DagsterRunStatus.STARTING)
        )
        stuck = instance.add_run(
            DagsterRun(job_name="__ASSET_JOB", status=DagsterRunStatus.STARTING)
        )
        started = instance.add_run(
            DagsterRun(job_name="stream_worker", status=DagsterRunStatus.STARTED)
        )
        hold = instance.add_run(
            DagsterRun(job_name=CLI_ACTION_JOB, status=DagsterRunStatus.STARTED)
        )

        def start_worker() -> None:  # what the run worker does once it has loaded the job
            with DagsterInstance.from_config(str(tmp_path)) as worker:
                start = DagsterEvent(DagsterEventType.RUN_START.value, job_name="__ASSET_JOB")
                worker.report_dagster_event(start, run_id=starts.run_id)

        timer = threading.Timer(0.5, start_worker)
        timer.start()
        try:
            lines = cancel_active_runs(
                instance, "make dev stopped", frozenset([CLI_ACTION_JOB]), starting_timeout_s=3.0
            )
        finally:
            timer.join()
        assert len(lines) == 4, lines
        status = {run.run_id: run.status for run in instance.get_runs()}
        assert status[queued.run_id] == DagsterRunStatus.CANCELED
        assert status[starts.run_id] == DagsterRunStatus.CANCELING
        assert status[stuck.run_id] == DagsterRunStatus.CANCELED
        assert status[started.run_id] == DagsterRunStatus.CANCELING
        assert status[hold.run_id] == DagsterRunStatus.STARTED
        swept = cancel_stopped_runs(instance, "make dev stopped", frozenset([CLI_ACTION_JOB]))
        assert len(swept) == 2, swept
        status = {run.run_id: run.status for run in instance.get_runs()}
        assert status[started.run_id] == status[starts.run_id] == DagsterRunStatus.CANCELED
        assert status[hold.run_id] == DagsterRunStatus.STARTED
