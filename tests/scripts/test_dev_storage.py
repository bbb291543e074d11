"""`make dev` on an empty DAGSTER_HOME (scripts/dev.py ``prepare_state`` and ``start_dagster``):
the instance's storage is created once, before ``dagster dev`` and the metrics endpoint start, so
every start finds one schema head and a UI that answers; a state folder it cannot repair gets a
one-line answer naming the file to remove, before anything starts.

Before, ``dagster dev`` and ``platform metrics`` started at the same moment on a home without
storage and both created it: one cold start in ten here left ``schedules.db`` at the wrong
schema version, and on a fresh machine two version rows that broke every later ``make dev``
(platform_assets/instance.py). The processes are ``make dev``'s own, on the session broker, with
a pipelines file of no pipelines: the storage is the same, and no run or Spark starts.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

from platform_assets.instance import STORAGE_FILES
from resources.embedded import EmbeddedBroker, find_free_port
from tests.scripts.test_dev_restart import load_dev_script
from tests.support.dev_stack import ROOT, answers, wait_for

pytestmark = pytest.mark.integration
STARTS = 4  # two rounds of AT_ONCE: the storage is made before any process starts
AT_ONCE = 2  # starts in flight at a time, on 2 cores
HEAD = "29b539ebc72a"  # the installed Dagster 1.13's storage schema head (constraints.txt)


def versions(home: Path) -> dict[str, list[str]]:
    """Each storage file's schema version rows ([] for a file not there)."""
    found: dict[str, list[str]] = {}
    for item in STORAGE_FILES:
        path = home / item.path
        if not path.is_file():
            found[item.path] = []
            continue
        with contextlib.closing(sqlite3.connect(path)) as connection:
            rows = connection.execute("select version_num from alembic_version").fetchall()
        found[item.path] = [row[0] for row in rows]
    return found


def scraped(port: int) -> bool:
    """Whether the metrics endpoint answers a scrape."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            return b"kafka_iceberg" in answer.read()
    except OSError:
        return False


def start_once(dev: ModuleType, state: Path, broker: EmbeddedBroker, pipelines: Path) -> None:
    """One `make dev` start of Dagster's processes on the empty home of ``state``: the storage
    has one head before they start and after the UI answered and the endpoint was scraped."""
    home = dev.prepare_state(state)
    one_head = {item.path: [HEAD] for item in STORAGE_FILES}
    # Created before any process that opens it starts (4769409's dev.py created none here).
    assert versions(home) == one_head, f"{state.name}: before the processes"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "PLATFORM_STATE_DIR": str(state),
        "PLATFORM_PIPELINES_FILE": str(pipelines),
        "PLATFORM_SPARK_REMOTE": "",
    }
    processes = dev.start_dagster(state, env, find_free_port(), find_free_port())
    log, metrics_log = state / "logs" / "dagster.log", state / "logs" / "metrics.log"
    try:
        ui, metrics = processes.ui_port, processes.metrics_port
        wait_for(f"{state.name}: the UI (log: {log})", lambda: answers(ui), 120, 0.5)
        wait_for(f"{state.name}: a scrape (log: {metrics_log})", lambda: scraped(metrics), 60, 0.5)
    finally:
        dev.stop_dagster(processes, home)
    assert versions(home) == one_head, f"{state.name}: after the UI answered"
    assert "alembic" not in log.read_text() + metrics_log.read_text()


def test_every_start_on_an_empty_home_finds_one_head_and_a_ui(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """:data:`STARTS` starts, :data:`AT_ONCE` at a time (each on its own home: the machine's
    load makes the old race likelier, not the new code's answer different)."""
    dev = load_dev_script()
    pipelines = tmp_path / "pipelines.yaml"
    pipelines.write_text("pipelines: []\n")
    states = [tmp_path / f"start-{start}" for start in range(STARTS)]
    with ThreadPoolExecutor(AT_ONCE) as pool:
        for done in [pool.submit(start_once, dev, state, broker, pipelines) for state in states]:
            done.result()


def test_a_broken_state_folder_gets_one_line_naming_the_file(tmp_path: Path) -> None:
    """A storage whose version table holds revisions this Dagster does not know: `make dev`
    stops before starting anything, in one line that names the file and what removing it loses.
    (The race's own leftovers are repaired: tests/platform_assets/test_instance.py.)"""
    home = load_dev_script().prepare_state(tmp_path)
    schedules = home / "schedules" / "schedules.db"
    with contextlib.closing(sqlite3.connect(schedules)) as connection, connection:
        connection.execute("delete from alembic_version")
        connection.executemany(
            "insert into alembic_version values (?)", [("aaaaaaaaaaaa",), ("bbbbbbbbbbbb",)]
        )
    started = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "dev.py"), "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert started.returncode == 2, started.stdout + started.stderr
    lines = started.stderr.strip().splitlines()
    assert len(lines) == 1, started.stderr
    assert lines[0].startswith(f"make dev: {schedules} holds schema version(s) aaaa"), lines[0]
    assert "remove it (sensor and schedule state and ticks only: removing it keeps" in lines[0]
    assert not (tmp_path / "kafka").exists()  # nothing started
