"""The embedded Kafka broker: Apache Kafka 4.4 in KRaft mode, one node, on free loopback ports.

The jars come from Maven Central once (``resources/jvm/kafka/pom.xml``, see :mod:`resources.jvm`).
Each start formats the storage directory with Kafka's own ``StorageTool`` (an already formatted one
is kept) and starts ``kafka.Kafka`` as a combined broker and controller with a bounded heap. The
storage is removed on stop unless ``data_dir`` is given (then a restart keeps the topics; the
cluster id is the one that directory was formatted with). It is for ``make dev``, the tests and
the benchmarks, never for production.

A second listener speaks SASL_SSL (SCRAM-SHA-512) when ``sasl_ssl`` is given: the production-shaped
tests use it with a CA of their own (``tests/support/tls.py``).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from resources.jvm import LOG4J2_CONFIG, ClassDataSharing, class_path, java_binary
from resources.process import ManagedProcess

FORMAT_TIMEOUT_S = 120.0


class BrokerStartError(RuntimeError):
    """The embedded broker did not come up."""


def find_free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cluster_id_for(name: str) -> str:
    """The KRaft cluster id of the embedded cluster called ``name`` (stable across restarts).

    KRaft ids are 16 bytes in URL-safe base64; deriving them from a name keeps each test's and
    ``make dev``'s clusters distinct and recognisable in logs without a random id.
    """
    digest = hashlib.sha256(name.encode()).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


@dataclass(frozen=True)
class SaslSslListener:
    """A SASL_SSL listener with SCRAM-SHA-512 users, TLS from a PKCS#12 keystore."""

    keystore: Path
    keystore_password: str
    users: dict[str, str]
    port: int | None = None


class EmbeddedBroker(ManagedProcess):
    """An Apache Kafka broker process, started and stopped as a context manager.

    The process runs in its own process group and is always stopped on exit (SIGTERM, then
    SIGKILL after ``stop_timeout_s``), so no broker outlives its owner. Its output goes to
    ``log_path``; its storage to ``data_dir`` (a temporary directory removed on stop by default).

    Example:
        >>> with EmbeddedBroker(log_path=tmp_dir / "kafka.log") as broker:
        ...     broker.bootstrap_servers.startswith("127.0.0.1:")
        True
    """

    def __init__(
        self,
        log_path: str | Path,
        port: int | None = None,
        name: str = "embedded",
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 5.0,
        advertised_port: int | None = None,
        data_dir: str | Path | None = None,
        heap_mb: int = 512,
        sasl_ssl: SaslSslListener | None = None,
        config: dict[str, str] | None = None,
    ) -> None:
        self.log_path = Path(log_path)
        self.port = port
        # Advertise another port than the one listened on: a proxy in front of the broker.
        self.advertised_port = advertised_port
        self.name = name
        self.cluster_id = cluster_id_for(name)
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.heap_mb = heap_mb
        self.sasl_ssl = sasl_ssl
        self.sasl_ssl_port: int | None = None
        self.extra_config = dict(config or {})
        self._data_dir = Path(data_dir) if data_dir else None
        self._owned_dir: Path | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of the PLAINTEXT listener, for ``bootstrap.servers``."""
        if self.port is None:
            raise BrokerStartError("the broker is not started")
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_ssl_bootstrap_servers(self) -> str:
        """``host:port`` of the SASL_SSL listener (only with ``sasl_ssl``)."""
        if self.sasl_ssl_port is None:
            raise BrokerStartError("the broker has no SASL_SSL listener, or is not started")
        return f"127.0.0.1:{self.sasl_ssl_port}"

    def start(self, attempts: int = 3) -> Self:
        """Format the storage, start the broker and wait until it serves; retry on a port race.

        Served means: the process is alive, its port accepts connections, and its log says
        "Kafka Server started" since this start (Kafka binds its listeners before it serves, and
        a port taken by another process also accepts connections). Whatever interrupts the start
        (an error, Ctrl-C) stops the process and removes the storage it owns.
        """
        cp = class_path("kafka")
        try:
            for attempt in range(attempts):
                if self._start_once(cp, share_classes=attempt == 0):
                    return self
                self.stop()  # exited (a port race) or never served; the next try shares no
                # classes, should the archive be what failed it
        except BaseException:
            self.stop()
            raise
        raise BrokerStartError(f"Kafka did not start; its log follows:\n{self.read_log()}")

    def _start_once(self, cp: str, share_classes: bool = True) -> bool:
        port = self.port or find_free_port()
        controller = find_free_port()
        secure = (self.sasl_ssl.port or find_free_port()) if self.sasl_ssl else None
        data = self._storage_dir()
        properties = data.parent / f"{data.name}.properties"
        properties.write_text(self._server_properties(port, controller, secure, data))
        self._format(cp, properties)
        log_from = self.log_path.stat().st_size if self.log_path.exists() else 0

        def started() -> bool:
            with self.log_path.open("rb") as log:
                log.seek(log_from)
                return b"Kafka Server started" in log.read()

        sharing: list[str] | None = None if share_classes else []
        self.spawn(self._java(cp, "kafka.Kafka", str(properties), sharing=sharing))
        if not self.wait_listening(port, self.start_timeout_s, interval_s=0.1, ready=started):
            return False
        self.port, self.sasl_ssl_port = port, secure
        return True

    def stop(self) -> None:
        """Stop the broker and remove the storage it owns."""
        super().stop()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    def _storage_dir(self) -> Path:
        """``data_dir`` (kept across starts: a restart keeps the data), else a directory owned
        by this object, removed on stop."""
        if self._data_dir is not None:
            self._data_dir.mkdir(parents=True, exist_ok=True)
            return self._data_dir / "kraft"
        if self._owned_dir is None:
            self._owned_dir = Path(tempfile.mkdtemp(prefix=f"kafka-{self.name}-"))
        return self._owned_dir / "kraft"

    def _java(self, cp: str, main: str, *args: str, sharing: list[str] | None = None) -> list[str]:
        return [
            java_binary(),
            f"-Xmx{self.heap_mb}m",
            "-Xms64m",
            "-XX:+UseSerialGC",  # one GC thread: these machines have 2 cores and many servers
            *(sharing if sharing is not None else self.class_sharing_options(main, cp)),
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            "-cp",
            cp,
            main,
            *args,
        ]

    def _format(self, cp: str, properties: Path) -> None:
        """Format the storage with Kafka's ``StorageTool`` (a JVM that exits at once: its first
        run dumps the class data sharing archive). A run that fails with sharing runs again
        without it (a dump the disk had no room for exits with 1), so sharing never costs a
        start."""
        tool = "kafka.tools.StorageTool"
        sharing = ClassDataSharing.for_server(tool, cp)
        started = time.monotonic()
        result = self._run_format(cp, properties, tool, sharing)
        if result.returncode != 0 and sharing.options:
            result = self._run_format(cp, properties, tool, None)
        if result.returncode != 0:
            raise BrokerStartError(
                f"formatting the storage of broker {self.name!r} failed after "
                f"{time.monotonic() - started:.1f} s:\n{result.stdout}{result.stderr}"
            )

    def _run_format(
        self, cp: str, properties: Path, tool: str, sharing: ClassDataSharing | None
    ) -> subprocess.CompletedProcess[str]:
        command = self._java(
            cp,
            tool,
            "format",
            "--ignore-formatted",
            "-t",
            self.cluster_id,
            "-c",
            str(properties),
            sharing=sharing.options if sharing else [],
        )
        if self.sasl_ssl:  # SCRAM users exist from the first start (no admin call before auth)
            for user, password in self.sasl_ssl.users.items():
                command += ["--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]"]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            if sharing is not None:
                sharing.publish(complete=False)  # killed: whatever it dumped may be half written
            raise BrokerStartError(
                f"formatting the storage of broker {self.name!r} took over {FORMAT_TIMEOUT_S} s"
            ) from exc
        if sharing is not None:
            sharing.publish(complete=result.returncode == 0)
        return result

    def _server_properties(self, port: int, controller: int, secure: int | None, data: Path) -> str:
        advertised = self.advertised_port or port
        listeners = [f"PLAINTEXT://127.0.0.1:{port}", f"CONTROLLER://127.0.0.1:{controller}"]
        advertise = [f"PLAINTEXT://127.0.0.1:{advertised}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        config = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(data),
            # One node: every internal topic has one replica, and few partitions start faster.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # No time retention by default: a test or demo record stamped with an old event time
            # stays (Kafka's 7-day default would delete it within a check interval). A topic
            # that sets retention.ms (and a small segment.ms: the active segment is never
            # deleted) has it checked every second, not every 5 minutes.
            "log.retention.ms": "-1",
            "log.retention.check.interval.ms": "1000",
            "log.initial.task.delay.ms": "0",
        }
        if self.sasl_ssl is not None and secure is not None:
            listeners.append(f"SASL_SSL://127.0.0.1:{secure}")
            advertise.append(f"SASL_SSL://127.0.0.1:{secure}")
            protocols.append("SASL_SSL:SASL_SSL")
            config |= {
                "sasl.enabled.mechanisms": "SCRAM-SHA-512",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
                "ssl.keystore.type": "PKCS12",
                "ssl.keystore.location": str(self.sasl_ssl.keystore),
                "ssl.keystore.password": self.sasl_ssl.keystore_password,
                "ssl.endpoint.identification.algorithm": "",
            }
        config |= {
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertise),
            "listener.security.protocol.map": ",".join(protocols),
        }
        config |= self.extra_config
        return "".join(f"{key}={value}\n" for key, value in config.items())
