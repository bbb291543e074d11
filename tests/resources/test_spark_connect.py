"""A long-lived Spark: an ingestion through a Spark Connect server (``spark.remote``).

The server (``resources.spark_connect``, from the PySpark wheel) starts once for the module.
Its Python workers run an environment without the project, so they import the engine only
from the zip the run ships as a session artifact. The driver is a separate process (a Connect
session switches its process to Connect mode) that materializes the pipeline through Dagster;
the engine fans its tasks out as a DataFrame (``mapInArrow``), never through a SparkContext,
which Connect does not have. The oracle judges the table from this process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark_connect import SparkConnectServer
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, NewPipeline, records
from tests.support.spark_cluster import make_executor_python, run_driver

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def executor_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_executor_python(tmp_path_factory.mktemp("connect-executor-env"))


@pytest.fixture(scope="module")
def connect_server(
    tmp_path_factory: pytest.TempPathFactory, executor_python: Path
) -> Iterator[SparkConnectServer]:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    server = SparkConnectServer(
        tmp_path_factory.mktemp("spark-connect"),
        master="local[2]",
        conf={"spark.pyspark.python": str(executor_python), "spark.driver.memory": "1g"},
        environ=environ,
    )
    with server:
        yield server
    assert server.pid is None


def test_ingestion_through_spark_connect(
    connect_server: SparkConnectServer,
    executor_python: Path,
    kafka: KafkaResource,
    tmp_path: Path,
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
) -> None:
    topic, spec = new_pipeline(
        "connect", partitions=3, produce=900, table="connect.events", max_records_per_task=200
    )
    state_dir = tmp_path / "state"
    config = {
        "spec": spec.model_dump(mode="json", by_alias=True),
        "bootstrap_servers": kafka.bootstrap_servers,
        "state_dir": str(state_dir),
        "remote": connect_server.remote,
    }
    first = run_driver(config, tmp_path)

    assert first["success"]
    assert first["connect"]
    assert first["master"] == "local[2]"  # the server's, not the run's
    for executor in first["executors"]:
        assert executor["pid"] not in (first["driver_pid"], os.getpid())
        assert executor["python"] == str(executor_python)
        assert ".zip" in executor["engine"], executor  # the session's artifact, not installed
    (table_run,) = [m for m in first["materializations"] if m["asset"] == "iceberg/connect/events"]
    assert table_run["metadata"]["records"] == 900

    # A second run (a new process, a new Connect session) on the same server picks up where
    # the table's offsets say, with the engine shipped again to its own session.
    ledger_producer.produce(topic, records(300, first=900))
    second = run_driver(config, tmp_path)
    assert second["success"]
    (table_run,) = [m for m in second["materializations"] if m["asset"] == "iceberg/connect/events"]
    assert table_run["metadata"]["records"] == 300

    catalog = IcebergCatalogResource(state_dir=str(state_dir)).load_catalog()
    judge = dataclasses.replace(harness, catalog=catalog)
    assert judge.assert_exactly_once(spec, ledger).rows == 1200
    files = catalog.load_table(spec.table).inspect.files()
    assert files.num_rows >= 5  # 900 records / 200 per task over 3 partitions: split tasks
