"""A long-lived Spark Connect server from the installed PySpark wheel, for ``make dev``, the
benchmarks and the tests: every Dagster run attaches to it (``spark.remote``) instead of
starting its own JVM.

PySpark 4.x ships the server (``jars/spark-connect_*.jar``, ``sbin/start-connect-server.sh``).
In production run it as a service next to the cluster (``--master spark://...``); this class is
the single-machine form.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Self

from resources.embedded import find_free_port
from resources.process import ManagedProcess
from resources.spark import FAIR_SCHEDULING


class ConnectServerError(RuntimeError):
    """The Spark Connect server did not start; the message carries its log's tail."""


def find_spark_home() -> Path:
    """The installed PySpark's directory, which is a SPARK_HOME (jars/, sbin/, bin/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class SparkConnectServer(ManagedProcess):
    """A Spark Connect server in its own process group, started and stopped as a context
    manager (SIGTERM, then SIGKILL), so no server outlives its owner.

    Its Python workers run this interpreter (``PYSPARK_PYTHON``; ``spark.pyspark.python`` in
    ``conf`` to change it) with this process's environment (``environ`` to change it), so they
    import the installed engine. ``remote`` is what ``spark.remote``
    takes. Sessions attached to it are independent (their own SQL conf, artifacts and temp
    views) and share the JVM and its executors.
    """

    def __init__(
        self,
        log_dir: str | Path,
        master: str = "local[2]",
        port: int | None = None,
        conf: dict[str, str] | None = None,
        start_timeout_s: float = 180.0,
        stop_timeout_s: float = 20.0,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.master = master
        self.port = port
        self.conf = conf or {}
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.environ = environ

    @property
    def remote(self) -> str:
        """The ``sc://host:port`` URL sessions attach to."""
        if self.port is None:
            raise ConnectServerError("the Spark Connect server is not started")
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:  # type: ignore[override]  # derived from log_dir
        """Where the server's output goes."""
        return self.log_dir / "spark-connect.log"

    @property
    def python(self) -> str:
        """The interpreter of the server's Python workers."""
        return self.conf.get("spark.pyspark.python", sys.executable)

    def command(self, port: int) -> list[str]:
        """The foreground (``--wait``) start command for ``port``."""
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "8",
            "spark.pyspark.python": self.python,
            **FAIR_SCHEDULING,
            **self.conf,
        }
        script = find_spark_home() / "sbin" / "start-connect-server.sh"
        flags = [item for key, value in conf.items() for item in ("--conf", f"{key}={value}")]
        return ["bash", str(script), "--wait", "--master", self.master, *flags]

    def start(self) -> Self:
        """Start the server and wait until its gRPC port accepts connections.

        Raises:
            ConnectServerError: the server exited or did not listen within the timeout.
        """
        port = self.port or find_free_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **(os.environ if self.environ is None else self.environ),
            "SPARK_HOME": str(find_spark_home()),
            "SPARK_LOG_DIR": str(self.log_dir),
            "SPARK_PID_DIR": str(self.log_dir),
            "PYSPARK_PYTHON": self.python,
        }
        self.spawn(self.command(port), env=env)
        if self.wait_listening(port, self.start_timeout_s, interval_s=0.25):
            self.port = port
            return self
        if self.pid is None:
            raise ConnectServerError(
                f"Spark Connect exited with {self.exit_code}; its log ({self.log_path}) ends:\n"
                f"{self.read_log()}"
            )
        self.stop()
        raise ConnectServerError(
            f"Spark Connect did not listen on 127.0.0.1:{port} within {self.start_timeout_s:g} "
            f"s; its log ({self.log_path}) ends:\n{self.read_log()}"
        )
