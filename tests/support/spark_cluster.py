"""A Spark standalone cluster on loopback, from the pyspark package: one master, one worker.

The master and the worker are separate JVMs (``spark-class``), each in its own process group,
always stopped on exit. The executors run Python from an *executor environment* that has the
project's dependencies but not the project itself (the editable install's ``.pth`` file is not
processed there), so the engine reaches them only the way it would reach a real cluster: shipped
by the driver (``SparkResource(ship_engine=True)``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from resources.embedded import find_free_port


def spark_home() -> Path:
    """The Spark distribution inside the pyspark package."""
    import pyspark

    return Path(pyspark.__file__).parent


def make_executor_python(target: Path) -> Path:
    """A bare venv that sees this venv's site-packages but not the project; its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = target / "lib" / version / "site-packages"
    # Entries of a .pth file join sys.path, but .pth files inside them are not processed:
    # the project's editable-install .pth in the main venv stays out.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return target / "bin" / "python"


class StandaloneCluster:
    """``spark://`` master and ``workers`` workers (each ``cores`` cores, its own work
    directory ``work-<n>``, where its executors run) on free loopback ports, as a context
    manager."""

    def __init__(
        self, work_dir: Path, cores: int = 2, memory: str = "2g", workers: int = 1
    ) -> None:
        self.work_dir = work_dir
        self.cores = cores
        self.memory = memory
        self.workers = workers
        self.port = find_free_port()
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, *args: str) -> Path:
        log = self.work_dir / f"{name}.log"
        env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_DAEMON_MEMORY": "384m"}
        properties = self.work_dir / "cluster.properties"
        properties.write_text("spark.master.rest.enabled false\nspark.ui.enabled false\n")
        with log.open("wb") as out:
            self._processes.append(
                subprocess.Popen(
                    [
                        str(spark_home() / "bin" / "spark-class"),
                        *args,
                        "--properties-file",
                        str(properties),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )
        return log

    def _wait_for(self, log: Path, pattern: str, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if re.search(pattern, log.read_text(errors="replace")):
                return
            if any(p.poll() is not None for p in self._processes):
                break
            time.sleep(0.25)
        raise RuntimeError(f"{log.name}: {pattern!r} not seen\n{log.read_text()[-3000:]}")

    def __enter__(self) -> StandaloneCluster:
        try:
            master = self._start(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(find_free_port()),
            )
            self._wait_for(master, r"I have been elected leader")
            for n in range(self.workers):
                self._start(
                    f"worker-{n}",
                    "org.apache.spark.deploy.worker.Worker",
                    self.master_url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--webui-port",
                    str(find_free_port()),
                    "--work-dir",
                    str(self.work_dir / f"work-{n}"),
                )
            self._wait_for(master, rf"(?s)(Registering worker.*){{{self.workers}}}")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM each JVM's process group, then SIGKILL what is left after 10 s."""
        for process in reversed(self._processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        self._processes.clear()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def run_driver(config: dict[str, Any], work_dir: Path) -> dict[str, Any]:
    """Run the driver process; return its report (fail with its output if it fails)."""
    path = work_dir / "driver.json"
    path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}  # set by local Spark
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.cluster_driver", str(path)],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("CLUSTER-REPORT ")]
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-8000:])
    assert lines, done.stdout[-4000:]
    report: dict[str, Any] = json.loads(lines[-1].removeprefix("CLUSTER-REPORT "))
    return report
