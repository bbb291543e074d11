"""The cost of one Dagster run, before and after: Spark per run vs Spark Connect vs in-process.

    .venv/bin/python bench/run_cost.py [--sizes 300 100000] [--repeats 3]

Path: each run is ``dagster.materialize`` of the pipeline's ingestion selection in a fresh
Python process (as the default run launcher's run worker is: it imports the code, builds the
resources, runs the step, exits), on a persistent Dagster instance per mode (the audit's cursor
survives between runs, as in ``make dev``). Every mode has its own table and group on one topic
and ingests the same new records each round. Modes:

- ``before``: what a run did in earlier releases: a local[2] Spark session started in the run, the
  exactly-once audit evaluated inside the run, Spark for every size;
- ``local``: the same local[2] session per run, the audit left to ``run_checks``;
- ``connect``: attached to one long-lived Spark Connect server (local[2]) started here once;
- ``driver``: prepared in the run process, no Spark (``in_process_max_records``);
- ``auto``: the shipped defaults: Connect for every batch (``in_process_max_records`` 0 by
  default; set it to compare the opt-in driver shortcut, which ``driver`` measures);
- ``postgres``: ``auto`` with the Dagster instance's run and event storage on a PostgreSQL
  server (embedded, started here once), as docs/production.md deploys it; the others use
  Dagster's default SQLite storage (a database file per run's event log), as ``make dev`` does;
- ``cli``: the shipped defaults through a real run instead of ``materialize``: ``dagster job
  execute`` of the pipeline's ingest job from the code location (``platform_assets.definitions``,
  dbt project included), with the job's own executor, configured only by the environment
  ``make dev`` sets (``PLATFORM_SPARK_REMOTE``, ``KAFKA_BOOTSTRAP_SERVERS``, ...).

Printed per size and mode: the median wall time from launching the process to RUN_SUCCESS, the
median RUN_START -> RUN_SUCCESS, the median time the engine took inside the run
(``run_pipeline``: plan, read, decode, write, commit, publish; the table's ``duration_s``
metadata), their ratio against ``before``, and, against the consume-only
limit measured here on the same records (``bench.workloads.limit``: confluent-kafka, one
process per task slot, no decode, no write), records/s of the run as a fraction of the limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.workloads import limit, produce, spec_for  # noqa: E402
from resources.embedded import EmbeddedBroker  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402
from resources.spark_connect import SparkConnectServer  # noqa: E402

PG_PASSWORD_ENV = "RUN_COST_PG_PASSWORD"
MODES = ("before", "local", "connect", "driver", "auto", "postgres", "cli")
ALWAYS_SPARK = 0
NEVER_SPARK = 10_000_000


def child(config: dict[str, Any]) -> dict[str, Any]:
    """One Dagster run in this (fresh) process; what it saw."""
    from dagster import AssetSelection, DagsterEventType, DagsterInstance, materialize

    from ingestion.spec.pipeline import PipelineSpec
    from platform_assets.ingest.assets import build_pipeline_assets
    from platform_assets.ingest.checks import build_pipeline_checks
    from platform_assets.ingest.jobs import ingestion_selection
    from platform_assets.pipelines import ingestion_keys
    from resources.iceberg import IcebergCatalogResource
    from resources.spark import SparkResource

    mode = config["mode"]
    spec = spec_for(f"cost_{mode}", config["topic"], None)
    default = PipelineSpec.model_fields["in_process_max_records"].default
    threshold = {"driver": NEVER_SPARK, "auto": default, "postgres": default}.get(
        mode, ALWAYS_SPARK
    )
    spec = spec.model_copy(update={"in_process_max_records": threshold})
    remote = config["remote"] if mode in ("connect", "auto", "postgres") else ""
    spark = SparkResource(master="local[2]", remote=remote)
    selection = (
        AssetSelection.assets(*ingestion_keys(spec))
        if mode == "before"
        else ingestion_selection(spec)
    )
    Path(config["instance_dir"]).mkdir(parents=True, exist_ok=True)
    instance = (
        DagsterInstance.from_config(config["instance_dir"])
        if mode == "postgres"
        else DagsterInstance.local_temp(config["instance_dir"])
    )
    result = materialize(
        [*build_pipeline_assets(spec), build_pipeline_checks(spec)],
        resources={
            "kafka": KafkaResource(bootstrap_servers=config["bootstrap"]),
            "iceberg": IcebergCatalogResource(state_dir=config["state_dir"]),
            "spark": spark,
        },
        selection=selection,
        instance=instance,
    )
    stamps = {
        entry.dagster_event_type: entry.timestamp
        for entry in instance.all_logs(
            result.run_id, of_type={DagsterEventType.RUN_START, DagsterEventType.RUN_SUCCESS}
        )
    }
    metadata = {
        m.asset_key.path[-1]: m.metadata
        for m in result.asset_materializations_for_node(f"ingest_{spec.name}")
    }[spec.table.split(".")[-1]]
    evaluated = sorted(e.check_name for e in result.get_asset_check_evaluations())
    instance.dispose()
    return {
        "run_s": stamps[DagsterEventType.RUN_SUCCESS] - stamps[DagsterEventType.RUN_START],
        "success_at": stamps[DagsterEventType.RUN_SUCCESS],
        "records": metadata["records"].value,
        "engine_s": metadata["duration_s"].value,
        "executed_in": metadata["executed_in"].value if "executed_in" in metadata else "",
        "checks": evaluated,
    }


def launch_cli(config: dict[str, Any]) -> dict[str, Any]:
    """A real run of the ingest job with ``dagster job execute``; what its instance recorded."""
    from dagster import DagsterEventType, DagsterInstance

    from ingestion.spec.pipeline import PipelineSpec
    from platform_assets.pipelines import table_key
    from tests.support.dagster_runs import job_execute_setup

    spec = spec_for("cost_cli", config["topic"], None)
    default = PipelineSpec.model_fields["in_process_max_records"].default
    spec = spec.model_copy(update={"in_process_max_records": default})
    added, command = job_execute_setup(
        Path(config["instance_dir"]), spec, config["bootstrap"], config["state_dir"]
    )
    home = added["DAGSTER_HOME"]
    env = {**os.environ, **added, "PLATFORM_SPARK_REMOTE": config["remote"]}
    started = time.time()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"cli failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    with DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_runs(limit=1)[0]
        stamps = {
            entry.dagster_event_type: entry.timestamp
            for entry in instance.all_logs(
                run.run_id,
                of_type={DagsterEventType.RUN_START, DagsterEventType.RUN_SUCCESS},
            )
        }
        event = instance.get_latest_materialization_event(table_key(spec))
        assert event is not None
        assert event.asset_materialization is not None
        metadata = event.asset_materialization.metadata
        checks = instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        names = sorted(
            e.dagster_event.event_specific_data.check_name  # type: ignore[union-attr]
            for e in checks
            if e.dagster_event is not None
        )
    success = stamps[DagsterEventType.RUN_SUCCESS]
    return {
        "run_s": success - stamps[DagsterEventType.RUN_START],
        "wall_s": success - started,
        "records": metadata["records"].value,
        "engine_s": metadata["duration_s"].value,
        "executed_in": metadata["executed_in"].value,
        "checks": names,
    }


def start_postgres(stack: contextlib.ExitStack) -> Any:
    """An embedded PostgreSQL server for the ``postgres`` mode, its password in the
    environment the run processes inherit (Dagster reads it through ``env``)."""
    from tests.support.postgres import PostgresServer

    os.environ[PG_PASSWORD_ENV] = f"pg-{secrets.token_hex(8)}"
    return stack.enter_context(PostgresServer(os.environ[PG_PASSWORD_ENV]))


def write_postgres_home(home: Path, pg: Any, database: str) -> None:
    """A Dagster home whose run, event and schedule storage is ``database`` on ``pg``."""
    import yaml

    pg.create_database(database)
    home.mkdir(parents=True, exist_ok=True)
    db = {
        "username": pg.user,
        "password": {"env": PG_PASSWORD_ENV},
        "hostname": "127.0.0.1",
        "port": pg.port,
        "db_name": database,
        "scheme": "postgresql+psycopg2",  # dagster-postgres ships psycopg2-binary
    }
    document = {"storage": {"postgres": {"postgres_db": db}}, "telemetry": {"enabled": False}}
    (home / "dagster.yaml").write_text(yaml.safe_dump(document))


def launch(config: dict[str, Any]) -> dict[str, Any]:
    """Run :func:`child` in a fresh process; add the wall time from launch to RUN_SUCCESS."""
    if config["mode"] == "cli":
        return launch_cli(config)
    started = time.time()
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(config)],
        capture_output=True,
        text=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RUN-COST ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{config['mode']} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    report: dict[str, Any] = json.loads(lines[-1].removeprefix("RUN-COST "))
    report["wall_s"] = report["success_at"] - started
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[300, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RUN-COST " + json.dumps(child(json.loads(args.child))), flush=True)
        return 0

    from confluent_kafka.admin import NewTopic

    from ingestion.kafka.ranges import OffsetRange
    from ingestion.kafka.topics import describe_topic

    work = Path(tempfile.mkdtemp(prefix="run-cost-"))
    rows: list[tuple[int, str, list[dict[str, Any]]]] = []
    limits: dict[int, float] = {}
    with (
        EmbeddedBroker(log_path=work / "kafka.log") as broker,
        SparkConnectServer(work / "spark", master="local[2]") as server,
        contextlib.ExitStack() as stack,
    ):
        pg = start_postgres(stack) if "postgres" in args.modes else None
        kafka = KafkaResource(bootstrap_servers=broker.bootstrap_servers)
        for size in args.sizes:
            topic = f"orders_{size}"
            admin = kafka.get_admin_client()
            for future in admin.create_topics([NewTopic(topic, args.partitions, 1)]).values():
                future.result(15)
            runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes}
            if pg is not None:
                write_postgres_home(work / f"dagster_{size}_postgres", pg, f"dagster_{size}")
            for _ in range(args.repeats + 1):  # round 0 warms up: tables created, caches read
                produce(kafka.client_config(), topic, size, args.partitions)
                for mode in args.modes:  # alternate: same backlog, same machine state
                    report = launch(
                        {
                            "mode": mode,
                            "topic": topic,
                            "bootstrap": broker.bootstrap_servers,
                            "state_dir": str(work / f"state_{size}"),
                            "instance_dir": str(work / f"dagster_{size}_{mode}"),
                            "remote": server.remote,
                        }
                    )
                    assert report["records"] == size, report
                    runs[mode].append(report)
            consumer = kafka.get_consumer()
            try:  # the whole topic: every round's records, a steadier rate than one round
                ends = describe_topic(kafka.get_admin_client(), consumer, topic).end_offsets
            finally:
                consumer.close()
            ranges = [OffsetRange(topic, p, 0, end) for p, end in ends.items() if end > 0]
            limits[size] = statistics.median(
                limit(kafka.client_config(), ranges, 2) for _ in range(3)
            )
            rows += [(size, mode, reports[1:]) for mode, reports in runs.items()]
    shutil.rmtree(work, ignore_errors=True)
    print_table(rows, limits)
    return 0


def print_table(
    rows: list[tuple[int, str, list[dict[str, Any]]]], limits: dict[int, float]
) -> None:
    """One line per size and mode: medians, ratios to ``before`` and to the consume limit
    (records/s from launch, from RUN_START, and of the engine alone)."""
    print(
        f"{'records':>8} {'mode':<8} {'prepared':<9} {'launch->ok s':>12} {'run s':>7} "
        f"{'engine s':>8} {'/before':>8} {'x limit: launch':>15} {'run':>6} {'engine':>6}"
        "  checks in the run"
    )
    before = {
        size: statistics.median(r["wall_s"] for r in reports)
        for size, mode, reports in rows
        if mode == "before"
    }
    for size, mode, reports in rows:
        wall, run, engine = (
            statistics.median(r[key] for r in reports) for key in ("wall_s", "run_s", "engine_s")
        )
        ratio = f"{before[size] / wall:>7.2f}x" if size in before else f"{'':>8}"
        fractions = [size / seconds / limits[size] for seconds in (wall, run, engine)]
        checks = ",".join(c.split("_")[0] for c in reports[-1]["checks"])
        print(
            f"{size:>8} {mode:<8} {reports[-1]['executed_in']:<9} {wall:>12.2f} {run:>7.2f} "
            f"{engine:>8.2f} {ratio} {fractions[0]:>15.3f} {fractions[1]:>6.3f} "
            f"{fractions[2]:>6.3f}  {checks}"
        )
    for size, rate in limits.items():
        print(f"consume-only limit, {size} records: {rate:,.0f} records/s (2 processes)")


if __name__ == "__main__":
    raise SystemExit(main())
