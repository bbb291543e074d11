"""Another engine maintaining the platform's tables: Spark with Apache Iceberg's Spark runtime
running Iceberg's standard procedures, in a process of its own (as another team's Spark job).

The runtime jar (``org.apache.iceberg:iceberg-spark-runtime-4.1_2.13``, Maven Central) and the
SQLite JDBC driver come from ``resources/jvm/iceberg-spark/pom.xml``. Iceberg 1.12's newest
runtime is for Spark 4.1 (on the suite's Spark 4.3 it fails to load: IncompatibleClassChangeError
on ``SparkView``), so the child runs PySpark :data:`OTHER_PYSPARK` from a virtual environment of
its own, made once under the JVM cache directory (``resources.jvm.cache_dir``), as another team's
Spark would be. The platform's SQL catalog is opened by Iceberg's own ``JdbcCatalog`` on the same
SQLite file: both commit by compare-and-set on the same row of ``iceberg_tables``.

Protocol: the child reads one JSON request per line and answers one JSON line: the rows, or the
error. ``{"call": "<procedure>", "args": "..."}`` runs
``CALL <catalog>.system.<procedure>(<args>)``; ``{"read": "<table>", "options": {...}}`` reads
the table with Spark read options (an incremental read: ``start-snapshot-id``,
``end-snapshot-id``).
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# 4.1.4: the newest PySpark of the newest Spark line Iceberg 1.12's Spark runtime supports (4.1).
OTHER_PYSPARK = "pyspark==4.1.4"


def other_spark_python() -> str:
    """The interpreter of the other engine's virtual environment, made on first use with
    :data:`OTHER_PYSPARK` and published by rename (a crash leaves no half-made one; the child
    runs ``bin/python`` with a script, which a moved venv serves). One process makes it: the
    others (the suite's workers on a fresh machine) wait on its lock instead of each installing
    PySpark at once."""
    from resources.jvm import cache_dir

    home = cache_dir() / ("venv-" + OTHER_PYSPARK.replace("==", "-"))
    python = home / "bin" / "python"
    home.parent.mkdir(parents=True, exist_ok=True)
    with home.with_name(f"{home.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not python.exists():
            staging = home.with_name(f"{home.name}.partial")
            shutil.rmtree(staging, ignore_errors=True)  # a crashed maker's
            subprocess.run([sys.executable, "-m", "venv", str(staging)], check=True)
            pip = [str(staging / "bin" / "python"), "-m", "pip", "install", "--quiet"]
            subprocess.run([*pip, OTHER_PYSPARK], check=True)
            staging.rename(home)
    return str(python)


def iceberg_spark_config(name: str, catalog_properties: dict[str, str]) -> dict[str, str]:
    """Spark configuration that opens the platform's embedded SQL catalog under its own
    ``name`` (pyiceberg and Iceberg's JdbcCatalog both keep the catalog's name in each row).

    Example:
        >>> config = iceberg_spark_config(
        ...     "default",
        ...     {"uri": "sqlite:////tmp/p/catalog.db", "warehouse": "file:///tmp/p/warehouse"})
        >>> config["spark.sql.catalog.default.uri"]
        'jdbc:sqlite:/tmp/p/catalog.db'
    """
    from resources.jvm import class_path

    uri = catalog_properties["uri"]
    assert uri.startswith("sqlite:///"), "the embedded SQL catalog (SQLite)"
    return {
        "spark.jars": class_path("iceberg-spark").replace(":", ","),
        "spark.sql.extensions": (
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
        ),
        f"spark.sql.catalog.{name}": "org.apache.iceberg.spark.SparkCatalog",
        f"spark.sql.catalog.{name}.type": "jdbc",
        f"spark.sql.catalog.{name}.uri": "jdbc:sqlite:" + uri.removeprefix("sqlite:///"),
        # V0: the table layout pyiceberg creates; V1 would add a column to it.
        f"spark.sql.catalog.{name}.jdbc.schema-version": "V0",
        f"spark.sql.catalog.{name}.warehouse": catalog_properties["warehouse"],
        # Plan each procedure from the table as it is now, not as cached up to 30 s ago: a
        # rewrite_manifests planned from a stale snapshot fails its validation once the
        # platform's appends (pyiceberg drops manifests left with deleted entries only) moved on.
        f"spark.sql.catalog.{name}.cache-enabled": "false",
        "spark.master": "local[1]",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "512m",
    }


class OtherSpark:
    """The child process: ``call(procedure, args)`` runs one procedure, returns its rows."""

    def __init__(self, name: str, catalog_properties: dict[str, str], log: Path) -> None:
        self._log = log.open("w")
        config = iceberg_spark_config(name, catalog_properties)
        self._process = subprocess.Popen(
            [other_spark_python(), __file__, name, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=ROOT,
        )

    def call(self, procedure: str, args: str) -> list[dict[str, Any]]:
        """Run ``CALL <catalog>.system.<procedure>(<args>)``; raise on its error."""
        return self._ask({"call": procedure, "args": args})

    def read(self, table: str, options: dict[str, str]) -> list[dict[str, Any]]:
        """The rows of ``table`` read with Spark read ``options`` (e.g. an incremental read)."""
        return self._ask({"read": table, "options": options})

    def _ask(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the Spark process exited; see {self._log.name}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{request}: {answer['error']}")
        return list(answer["rows"])

    def close(self) -> None:
        """End the child (closing its input ends its loop)."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._log.close()

    def __enter__(self) -> OtherSpark:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(name: str, config: dict[str, str]) -> None:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in config.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if "read" in request:
                frame = spark.read.options(**request["options"]).table(f"{name}.{request['read']}")
            else:
                frame = spark.sql(f"CALL {name}.system.{request['call']}({request['args']})")
            rows = [row.asDict() for row in frame.collect()]
            answer: dict[str, Any] = {"rows": json.loads(json.dumps(rows, default=str))}
        except Exception as exc:  # the caller raises it
            answer = {"error": str(exc)[:2000]}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    spark.stop()


if __name__ == "__main__":
    _serve(sys.argv[1], json.loads(sys.argv[2]))
