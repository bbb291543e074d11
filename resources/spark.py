"""The Spark resource: a lazily created SparkSession whose executors can import the engine, in
the run's own JVM (``master``) or attached to a long-lived Spark Connect server (``remote``)."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource
from dagster_pyspark import LazyPySparkResource
from pydantic import ConfigDict, Field, PrivateAttr

from resources.secrets import resolve, resolve_all

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


FAIR_SCHEDULING = {
    "spark.scheduler.mode": "FAIR",
    "spark.scheduler.allocation.file": str(Path(__file__).with_name("fairscheduler.xml")),
}
"""The jobs of one session share its executors fairly instead of first come, first served: a
stream worker's lanes submit batches at once, and one lane's large batch must not hold the
others' behind it (resources/fairscheduler.xml makes the default pool FAIR)."""


def session_config(master: str, app_name: str, spark_config: dict[str, str]) -> dict[str, str]:
    """Return the Spark configuration for a session, with the project's defaults under it.

    In local mode the Python workers run this interpreter (``sys.executable``), so they import
    pyarrow and the installed ``ingestion`` package; without it they would start ``python3``
    from PATH and fail. On a cluster set ``spark.pyspark.python`` (or ``PYSPARK_PYTHON``) to the
    executors' interpreter.

    Example:
        >>> config = session_config("local[2]", "demo", {"spark.sql.shuffle.partitions": "4"})
        >>> config["spark.master"], config["spark.sql.shuffle.partitions"]
        ('local[2]', '4')
    """
    defaults = {
        "spark.master": master,
        "spark.app.name": app_name,
        **FAIR_SCHEDULING,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
    }
    if master.startswith("local"):
        defaults["spark.pyspark.python"] = sys.executable
        defaults["spark.pyspark.driver.python"] = sys.executable
    return {**defaults, **resolve_all(spark_config, "spark.conf")}


class SparkResource(ConfigurableResource):
    """A PySpark session built on dagster-pyspark's ``LazyPySparkResource``: no JVM until used.

    With ``remote`` (``sc://host:port``) the run attaches a Spark Connect session to a
    long-lived server instead of starting a JVM (about 1 s instead of 10 s on 2 cores); the
    server owns master and executors, and ``spark_config`` must hold runtime (SQL) settings
    only. The engine's tasks are the same on both (``ingestion.pipeline.execute``).

    Executors must be able to import the ``ingestion`` package. In local mode they use this
    interpreter, where the project is installed. On a cluster either install the project's wheel
    on the executors, or set ``ship_engine=True`` to send a zip of ``ingestion/`` when the
    session starts (``SparkContext.addPyFile``; over Connect, ``addArtifacts(pyfile=True)``,
    once per session).
    """

    model_config = ConfigDict(extra="forbid")  # a misspelt setting fails at load

    master: str = Field(default="local[*]", description="Spark master URL.")
    app_name: str = Field(default="kafka-iceberg-platform", description="Spark application name.")
    spark_config: dict[str, str] = Field(
        default_factory=dict,
        description="Spark properties passed through to the session; ${NAME} references are "
        "resolved when the session starts.",
    )
    ship_engine: bool = Field(
        default=False, description="Zip ingestion/ and add it to the executors' Python path."
    )
    remote: str = Field(
        default="",  # the platform configuration's default is ${PLATFORM_SPARK_REMOTE:-}
        description="Spark Connect URL (sc://host:port) of a long-lived server to attach to; "
        "empty: start a session with ``master`` in the run process.",
    )
    _lazy: LazyPySparkResource | None = PrivateAttr(default=None)
    _remote_session: Any = PrivateAttr(default=None)

    def _get_lazy(self) -> LazyPySparkResource:
        if self._lazy is None:
            config = session_config(self.master, self.app_name, self.spark_config)
            if "spark.pyspark.python" in config:
                # A session started from a Python driver takes its workers' interpreter from
                # PYSPARK_PYTHON only (SparkContext.pythonExec, PySpark 4.3); the conf key is read
                # by spark-submit alone. Set it for this process unless the user already has.
                os.environ.setdefault("PYSPARK_PYTHON", config["spark.pyspark.python"])
            self._lazy = LazyPySparkResource(spark_config=config)
        return self._lazy

    @property
    def spark_session(self) -> SparkSession:
        """The session, created on first access (about 10 s on a 2-core machine; about 1 s to
        attach to a Spark Connect server)."""
        remote = resolve(self.remote, "spark.remote")
        if remote:
            return self._connect(remote)
        session: Any = self._get_lazy().spark_session
        if self.ship_engine:
            ship_engine_package(session.sparkContext)
        return session

    def _connect(self, remote: str) -> SparkSession:
        if self._remote_session is None:
            from pyspark.sql import SparkSession

            if not remote.startswith("sc://"):
                raise ValueError(
                    f"spark.remote resolves to {remote!r}, not a Spark Connect URL: set it to "
                    "sc://host:port, or leave it empty to start Spark in the run"
                )
            builder = SparkSession.builder.remote(remote)
            for key, value in resolve_all(self.spark_config, "spark.conf").items():
                builder = builder.config(key, value)
            session: Any = builder.getOrCreate()
            if self.ship_engine:
                session.addArtifacts(zip_engine_package(), pyfile=True)
            self._remote_session = session
        result: SparkSession = self._remote_session
        return result

    def stop_session(self) -> None:
        """Stop the session if it was started; the next access starts a new one. Over Spark
        Connect this ends the client session only; the server keeps running."""
        if self._remote_session is not None:
            self._remote_session.stop()
            self._remote_session = None
        if self._lazy is not None:
            self._lazy.spark_session.stop()
            self._lazy = None


# Spark applications (by id) that already received the engine: Dagster copies resources per
# run while getOrCreate() returns the same session, and Spark refuses a second ingestion.zip.
_SHIPPED_TO: set[str] = set()


def ship_engine_package(context: Any) -> None:
    """Add the ``ingestion`` zip to a SparkContext's Python path, once per application."""
    if context.applicationId not in _SHIPPED_TO:
        context.addPyFile(zip_engine_package())
        _SHIPPED_TO.add(context.applicationId)


@functools.cache
def zip_engine_package() -> str:
    """Zip the ``ingestion`` package for ``addPyFile`` (once per process); the archive path."""
    import ingestion

    package_dir = Path(ingestion.__file__).parent
    target = Path(tempfile.mkdtemp(prefix="ingestion-pyfiles-")) / "ingestion"
    archive = shutil.make_archive(str(target), "zip", package_dir.parent, package_dir.name)
    return archive
