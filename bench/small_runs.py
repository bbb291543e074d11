"""Small runs: the wall time of one ingestion run in a fresh process, Spark vs in-process.

    .venv/bin/python bench/small_runs.py [--runs 5] [--records 500]

Each run is a new Python process, as a Dagster run is: it imports the engine, plans, prepares
the files (starting a local[2] Spark session, or in the driver when the run plans at most
``in_process_max_records`` offsets) and commits. Both modes ingest the same number of new
records per run into their own table; the ratio is what to compare.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from bench.workloads import BROKER_STOP_S, produce, spec_for  # noqa: E402
from resources.embedded import EmbeddedBroker  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402


def child(bootstrap: str, state_dir: str, mode: str) -> None:
    """One run, as a Dagster run process would do it (lazy Spark)."""
    from ingestion.pipeline.run import run_pipeline
    from resources.iceberg import IcebergCatalogResource
    from resources.spark import SparkResource

    spec = spec_for(f"small_{mode}", "orders", None).model_copy(
        update={"in_process_max_records": 0 if mode == "spark" else 100_000}
    )
    kafka = KafkaResource(bootstrap_servers=bootstrap)
    catalog = IcebergCatalogResource(state_dir=state_dir).load_catalog()
    spark = SparkResource(master="local[2]")
    report = run_pipeline(
        spec, kafka.client_config(), catalog, lambda: spark.spark_session, kafka.get_cluster_id()
    )
    print(f"{report.records} {report.executed_in}")
    if report.executed_in == "spark":
        spark.stop_session()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--records", type=int, default=500)
    parser.add_argument("--child", nargs=3, metavar=("BOOTSTRAP", "STATE_DIR", "MODE"))
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    state = Path(tempfile.mkdtemp(prefix="small-runs-"))
    walls: dict[str, list[float]] = {"spark": [], "driver": []}
    with EmbeddedBroker(log_path=state / "kafka.log", stop_timeout_s=BROKER_STOP_S) as broker:
        kafka = KafkaResource(bootstrap_servers=broker.bootstrap_servers)
        from confluent_kafka.admin import NewTopic

        admin = kafka.get_admin_client()
        for future in admin.create_topics([NewTopic("orders", 4, 1)]).values():
            future.result(15)
        for _ in range(args.runs):
            produce(kafka.client_config(), "orders", args.records, 4)
            for mode in walls:  # alternate the modes: same backlog, same machine state
                started = time.monotonic()
                done = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        broker.bootstrap_servers,
                        str(state),
                        mode,
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                walls[mode].append(time.monotonic() - started)
                records, executed_in = done.stdout.split()[-2:]
                assert (int(records), executed_in) == (args.records, mode), done.stdout
    spark, driver = statistics.median(walls["spark"]), statistics.median(walls["driver"])
    print(f"{'mode':<8}{'runs':>6}{'records/run':>13}{'median s':>10}{'min s':>8}{'max s':>8}")
    for mode, values in walls.items():
        print(
            f"{mode:<8}{len(values):>6}{args.records:>13}{statistics.median(values):>10.2f}"
            f"{min(values):>8.2f}{max(values):>8.2f}"
        )
    print(f"in-process / spark wall time: {driver / spark:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
