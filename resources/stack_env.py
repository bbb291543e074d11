"""The connection settings of a running ``make dev``, where a second terminal finds them.

``make dev`` starts its broker on a free port, so a ``platform`` or ``dagster`` command in another
terminal cannot know the address. While it runs, ``make dev`` publishes its settings
(:data:`STACK_KEYS` it set: ``KAFKA_BOOTSTRAP_SERVERS``, ``DAGSTER_HOME``, ...) in the repository
root's ``.env``, the file the Dagster CLI reads from its working directory, and in
``.platform/stack.env``; it removes both when it stops. A ``.env`` that ``make dev`` did not write
(its first line is not :data:`MARKER`) is the user's and left alone: the settings are then in
``.platform/stack.env`` only. The ``platform`` CLI reads them with :func:`load_stack_env`; a
variable already set in the environment always wins.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "# Written by make dev (scripts/dev.py) while it runs; removed when it stops."
PID_KEY = "PLATFORM_DEV_PID"
STARTED_KEY = "PLATFORM_DEV_PROCESS_START"  # the process's start time (/proc, clock ticks)
STACK_KEYS = ("PLATFORM_PIPELINES_FILE", "PLATFORM_CONFIG")
"""Settings of the user's shell that ``make dev`` passes on to a second terminal, beside the
addresses of what it started (never a secret: alert sinks stay in the user's shell)."""
STACK_FILE = "stack.env"


@dataclass(frozen=True)
class PublishedStack:
    """Where :func:`publish_stack` wrote the settings (``written``: the ``.env`` first when it
    wrote one, ``stack.env`` last), and which ``.env`` it left alone because the user wrote it
    (``kept``)."""

    written: list[Path]
    kept: Path | None = None

    def describe(self) -> str:
        """One line for ``make dev``'s banner: what a second terminal types."""
        dotenv, stack_file = self.written[0], self.written[-1]
        if self.kept is not None:
            return (
                f"your {self.kept} is not make dev's (left alone); first run: "
                f"set -a; . {stack_file}; set +a"
            )
        if dotenv.name == ".env":
            return f"run .venv/bin/platform status (or dagster) in {dotenv.parent}: they read .env"
        return (
            f"PLATFORM_STATE_DIR={stack_file.parent} .venv/bin/platform status (it reads "
            f"{stack_file.name}), or first run: set -a; . {stack_file}; set +a"
        )


def publish_stack(root: Path | None, state_dir: Path, values: dict[str, str]) -> PublishedStack:
    """Write ``values`` and this process's id to ``state_dir/stack.env`` and, given a ``root``,
    to ``root/.env`` unless the user wrote their own."""
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    lines = [MARKER, f"# Started {started}."]
    process = {PID_KEY: str(os.getpid()), STARTED_KEY: str(_start_time(os.getpid()))}
    lines += [f"{key}={shlex.quote(value)}" for key, value in {**values, **process}.items()]
    text = "\n".join(lines) + "\n"
    dotenv = root / ".env" if root is not None else None
    kept = dotenv if dotenv is not None and dotenv.exists() and not _is_ours(dotenv) else None
    written = [dotenv] if dotenv is not None and kept is None else []
    written.append(state_dir / STACK_FILE)
    for path in written:
        path.write_text(text)
    return PublishedStack(written, kept)


def withdraw_stack(published: PublishedStack) -> None:
    """Remove what :func:`publish_stack` wrote (a file since rewritten by someone else stays)."""
    for path in published.written:
        if _is_ours(path) and _values(path).get(PID_KEY) == str(os.getpid()):
            path.unlink(missing_ok=True)


@dataclass
class StackEnv:
    """What :func:`load_stack_env` found: the file, the ``make dev`` process that wrote it,
    whether it still runs, the settings it applied, and the variables the shell had set to
    other values (then none was applied: half of one stack and half of another is no stack)."""

    path: Path
    pid: int | None
    running: bool
    applied: dict[str, str] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One line naming the stack a command talks to."""
        if not self.running:
            return (
                f"warning: {self.path} was written by a make dev (pid {self.pid}) that is no "
                "longer running: its settings were not used (start make dev, or remove the file)"
            )
        if self.conflicts:
            return (
                f"warning: {self.path} (make dev, pid {self.pid}) was not used: your shell sets "
                f"{', '.join(self.conflicts)} to other values (unset them to talk to make dev)"
            )
        kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "?")
        home = os.environ.get("DAGSTER_HOME", "?")
        return f"stack: make dev (pid {self.pid}, {self.path}): Kafka {kafka}, DAGSTER_HOME {home}"


def load_stack_env(directory: Path, state_dir: Path | None) -> StackEnv | None:
    """Apply the settings a running ``make dev`` published to ``os.environ``: those of
    ``state_dir/stack.env`` when a state folder is named (``PLATFORM_STATE_DIR``), else those of
    ``directory/.env``. All or none: a variable the shell set to another value keeps it and
    nothing is applied. None when the file is not ``make dev``'s; a file whose ``make dev`` no
    longer runs is not applied."""
    path = state_dir / STACK_FILE if state_dir is not None else directory / ".env"
    if not (path.is_file() and _is_ours(path)):
        return None
    values = _values(path)
    pid_text, started = values.pop(PID_KEY, ""), values.pop(STARTED_KEY, "")
    pid = int(pid_text) if pid_text.isdigit() else None
    found = StackEnv(path, pid, running=pid is not None and started == str(_start_time(pid)))
    if not found.running:
        return found
    found.conflicts = sorted(k for k, v in values.items() if os.environ.get(k, v) != v)
    if not found.conflicts:
        found.applied = {k: v for k, v in values.items() if k not in os.environ}
        os.environ.update(found.applied)
    return found


def _is_ours(path: Path) -> bool:
    with contextlib.suppress(OSError), path.open() as handle:
        return handle.readline().rstrip("\n") == MARKER
    return False


def _values(path: Path) -> dict[str, str]:
    from dotenv import dotenv_values

    return {key: value for key, value in dotenv_values(path).items() if value is not None}


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None when there is none: a pid
    reused by another process has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])
