"""The driver process of the cluster tests: materializes one pipeline's assets through Dagster
with ``SparkResource(master="spark://…", ship_engine=True)`` (or ``remote="sc://…"``: attached
to a Spark Connect server) and prints what it saw as JSON.

Run as ``python -m tests.support.cluster_driver CONFIG.json``; CONFIG holds ``spec`` (a raw
pipeline spec), ``bootstrap_servers``, ``state_dir``, and ``master`` and ``executor_python``,
or ``remote``. A separate process: a Spark Connect session switches its whole process to
Connect mode, which the test session's classic Spark must not see.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from dagster import materialize

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
            yield pa.RecordBatch.from_pylist(
                [{"pid": os.getpid(), "python": sys.executable, "engine": ingestion.__file__}]
            )

    frame = spark.range(0, 2, 1, 2).mapInArrow(where, "pid long, python string, engine string")
    return [row.asDict() for row in frame.collect()]  # DataFrames: classic and Connect alike


def main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    spec = parse_pipeline_spec(config["spec"])
    spark = (
        SparkResource(remote=config["remote"], ship_engine=True)
        if "remote" in config
        else cluster_spark(config)
    )
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
        "materializations": [
            {
                "asset": str(e.asset_key and e.asset_key.to_user_string()),
                "metadata": {
                    k: v.value
                    for k, v in e.materialization.metadata.items()
                    if isinstance(v.value, int | float | str)
                },
            }
            for e in result.get_asset_materialization_events()
        ],
    }
    spark.stop_session()
    print("CLUSTER-REPORT " + json.dumps(report))
    return 0 if result.success else 1


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
