"""The driver process of the cluster tests: materializes one pipeline's assets through Dagster
with ``SparkResource(master="spark://…", ship_engine=True)`` (or ``remote="sc://…"``: attached
to a Spark Connect server), or runs a stream worker (``stream_pipelines_job``) for several
pipelines until each table holds its expected rows, and prints what it saw as JSON.

Run as ``python -m tests.support.cluster_driver CONFIG.json``; CONFIG holds ``spec`` (a raw
pipeline spec) or ``stream`` (raw specs, each with the rows to wait for: ``{"spec": ...,
"rows": n}``), ``bootstrap_servers``, ``state_dir``, and ``master`` and ``executor_python``, or
``remote``. A separate process: a Spark Connect session switches its whole process to Connect
mode, which the test session's classic Spark must not see.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, materialize

from ingestion.spec.pipeline import parse_pipeline_spec
from platform_assets.ingest.assets import build_pipeline_assets
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource


def probe_executors(spark: Any) -> list[dict[str, Any]]:
    """Where each executor task runs and where it imports the engine from."""

    def where(batches: Any) -> Any:
        import pyarrow as pa

        import ingestion

        for _ in batches:
            time.sleep(0.5)  # long enough for the tasks to spread over every executor
            yield pa.RecordBatch.from_pylist(
                [
                    {
                        "pid": os.getpid(),
                        "python": sys.executable,
                        "engine": ingestion.__file__,
                        "cwd": os.getcwd(),  # <worker's work dir>/<app>/<executor id>
                    }
                ]
            )

    schema = "pid long, python string, engine string, cwd string"
    frame = spark.range(0, 8, 1, 8).mapInArrow(where, schema)
    return [row.asDict() for row in frame.collect()]  # DataFrames: classic and Connect alike


def materializations(result: Any) -> list[dict[str, Any]]:
    """Each materialization of an in-process result: its asset and its plain metadata."""
    return [
        {
            "asset": str(e.asset_key and e.asset_key.to_user_string()),
            "metadata": {
                k: v.value
                for k, v in e.materialization.metadata.items()
                if isinstance(v.value, int | float | str)
            },
        }
        for e in result.get_asset_materialization_events()
    ]


def main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    spark = (
        SparkResource(remote=config["remote"], ship_engine=True)
        if "remote" in config
        else cluster_spark(config)
    )
    if "stream" in config:
        return stream(config, spark)
    spec = parse_pipeline_spec(config["spec"])
    result = materialize(
        build_pipeline_assets(spec),
        resources={
            "kafka": KafkaResource(bootstrap_servers=config["bootstrap_servers"]),
            "iceberg": IcebergCatalogResource(state_dir=config["state_dir"]),
            "spark": spark,
        },
        raise_on_error=False,
    )
    session: Any = spark.spark_session
    report = {
        "success": result.success,
        "master": session.conf.get("spark.master"),
        "connect": type(session).__module__.startswith("pyspark.sql.connect"),
        "driver_pid": os.getpid(),
        "executors": probe_executors(session),
        "materializations": materializations(result),
    }
    spark.stop_session()
    print("CLUSTER-REPORT " + json.dumps(report))
    return 0 if result.success else 1


def stream(config: dict[str, Any], spark: SparkResource, timeout_s: float = 240.0) -> int:
    """Run the real stream worker job, assigned every pipeline as the stream sensor would,
    until each table holds its expected rows; then ask it to stop and report."""
    from platform_assets.streaming.jobs import (
        ASSIGNED_TAG,
        GENERATION_TAG,
        SHARD_TAG,
        STOP_TAG,
        active_workers,
        build_stream_job,
        dump_tag_map,
        spec_version,
    )

    specs = [parse_pipeline_spec(item["spec"]) for item in config["stream"]]
    rows = {spec.table: item["rows"] for spec, item in zip(specs, config["stream"], strict=True)}
    iceberg = IcebergCatalogResource(state_dir=config["state_dir"])
    resources = {
        "kafka": KafkaResource(bootstrap_servers=config["bootstrap_servers"]),
        "iceberg": iceberg,
        "spark": spark,
    }
    assigned = dump_tag_map({spec.name: spec_version(spec) for spec in specs})
    tags = {GENERATION_TAG: "cluster", SHARD_TAG: "0/1", ASSIGNED_TAG: assigned}
    outcome: dict[str, Any] = {}
    with DagsterInstance.ephemeral() as instance:

        def execute() -> None:
            result = build_stream_job(lambda: specs).execute_in_process(
                instance=instance, resources=resources, tags=tags, raise_on_error=False
            )
            outcome["success"] = result.success
            outcome["materializations"] = materializations(result)

        catalog = iceberg.load_catalog()  # first: creating the SQLite catalog's tables twice races
        thread = threading.Thread(target=execute, daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout_s
        landed: dict[str, int] = {}
        while time.monotonic() < deadline and landed != rows:
            time.sleep(1.0)
            for table in rows:
                if catalog.table_exists(table):
                    landed[table] = catalog.load_table(table).scan().to_arrow().num_rows
        for run in active_workers(instance):
            instance.add_run_tags(run.run_id, {STOP_TAG: "cluster test done"})
        thread.join(120)
    session: Any = spark.spark_session
    report = {
        **outcome,
        "landed": landed,
        "master": session.conf.get("spark.master"),
        "scheduler_mode": session.conf.get("spark.scheduler.mode"),
        "driver_pid": os.getpid(),
        "executors": probe_executors(session),
    }
    spark.stop_session()
    print("CLUSTER-REPORT " + json.dumps(report))
    return 0 if outcome.get("success") else 1


def cluster_spark(config: dict[str, Any]) -> SparkResource:
    """The driver's session on the standalone cluster, shipping the engine."""
    return SparkResource(
        master=config["master"],
        app_name="cluster-test",
        ship_engine=True,
        spark_config={
            "spark.pyspark.python": config["executor_python"],
            "spark.executor.memory": "1g",
            "spark.cores.max": "2",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        },
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
