"""The settings a running `make dev` publishes for a second terminal (resources/stack_env.py):
written where the CLIs look, never over the user's own ``.env``, read without overriding what
the shell set, ignored once the process that wrote them is gone, removed when it stops."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from resources.stack_env import (
    MARKER,
    PID_KEY,
    STACK_FILE,
    load_stack_env,
    publish_stack,
    withdraw_stack,
)

SETTINGS = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:41234", "DAGSTER_HOME": "/x/dagster_home"}


@pytest.fixture
def clean_env() -> Iterator[None]:
    """An environment without the published names (a fresh terminal); the whole environment
    restored after (loading writes to ``os.environ``)."""
    saved = dict(os.environ)
    for name in SETTINGS:
        os.environ.pop(name, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_published_settings_reach_a_fresh_terminal_and_go_when_it_stops(
    tmp_path: Path, clean_env: None
) -> None:
    root, state = tmp_path / "repo", tmp_path / "repo" / ".platform"
    state.mkdir(parents=True)
    published = publish_stack(root, state, SETTINGS)
    assert published.written == [root / ".env", state / STACK_FILE]
    assert (root / ".env").read_text().splitlines()[0] == MARKER
    assert "they read .env" in published.describe()

    found = load_stack_env(root, None)  # a fresh terminal in the repository root
    assert found is not None
    assert found.running
    assert found.pid == os.getpid()
    assert found.applied == SETTINGS
    assert os.environ["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:41234"
    assert f"pid {os.getpid()}" in found.describe()
    assert "Kafka 127.0.0.1:41234" in found.describe()

    withdraw_stack(published)
    assert not (root / ".env").exists()
    assert not (state / STACK_FILE).exists()


def test_the_state_folders_file_and_a_shell_that_disagrees(tmp_path: Path, clean_env: None) -> None:
    """With a state folder named, its ``stack.env`` is read (never a ``.env`` of another stack
    in the working directory); a variable the shell set to the same value is fine, to another
    value it wins and nothing of the file is applied (no half-and-half stack)."""
    publish_stack(None, tmp_path, SETTINGS)
    (tmp_path / "cwd").mkdir()
    publish_stack(tmp_path / "cwd", tmp_path / "cwd", {"KAFKA_BOOTSTRAP_SERVERS": "other:1"})
    os.environ["DAGSTER_HOME"] = "/x/dagster_home"  # the same value
    found = load_stack_env(tmp_path / "cwd", tmp_path)
    assert found is not None
    assert found.path == tmp_path / STACK_FILE
    assert found.applied == {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:41234"}
    del os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    os.environ["DAGSTER_HOME"] = "/prod/dagster_home"
    found = load_stack_env(tmp_path / "cwd", tmp_path)
    assert found is not None
    assert found.conflicts == ["DAGSTER_HOME"]
    assert found.applied == {}
    assert "KAFKA_BOOTSTRAP_SERVERS" not in os.environ
    assert "your shell sets DAGSTER_HOME to other values" in found.describe()


def test_the_users_own_dotenv_is_left_alone(tmp_path: Path, clean_env: None) -> None:
    (tmp_path / ".env").write_text("PLATFORM_SLACK_TOKEN=${VAULT_TOKEN}\n")
    (tmp_path / "state").mkdir()
    published = publish_stack(tmp_path, tmp_path / "state", SETTINGS)
    assert published.kept == tmp_path / ".env"
    assert published.written == [tmp_path / "state" / STACK_FILE]
    assert f". {tmp_path / 'state' / STACK_FILE}" in published.describe()
    withdraw_stack(published)
    assert (tmp_path / ".env").read_text() == "PLATFORM_SLACK_TOKEN=${VAULT_TOKEN}\n"
    assert load_stack_env(tmp_path, None) is None  # the .env is not make dev's


def test_settings_of_a_make_dev_that_is_gone_are_not_used(tmp_path: Path, clean_env: None) -> None:
    publish_stack(tmp_path, tmp_path, SETTINGS)
    ended = subprocess.Popen(["true"])  # a process that has ended
    ended.wait()
    dotenv = tmp_path / ".env"
    lines = [
        f"{PID_KEY}={ended.pid}" if line.startswith(f"{PID_KEY}=") else line
        for line in dotenv.read_text().splitlines()
    ]
    dotenv.write_text("\n".join(lines) + "\n")
    found = load_stack_env(tmp_path, None)
    assert found is not None
    assert not found.running
    assert found.applied == {}
    assert "KAFKA_BOOTSTRAP_SERVERS" not in os.environ
    assert found.describe().startswith(f"warning: {dotenv} was written by a make dev (pid ")
