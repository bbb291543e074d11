"""``make dev``: run the platform on the embedded stack until Ctrl-C.

Starts, in order: an Apache Kafka broker (KRaft, one node) on a free loopback port, the demo topic
and its producer, one Spark Connect server (``--spark connect``, the default: every ingestion run
attaches to it through ``PLATFORM_SPARK_REMOTE`` instead of starting its own JVM; ``--spark local``:
each run starts its own), ``dagster dev -w workspace.yaml`` (UI and daemon) with
``DAGSTER_HOME`` under ``.platform/``, and the metrics endpoint (``platform metrics`` on port
9464 when free: every pipeline's lag, commits, throughput, dead letters and checks, for
Prometheus). Everything it starts is stopped on Ctrl-C or SIGTERM, the broker last; nothing is
left running.

Each start begins with a fresh broker storage under ``.platform/kafka`` and so an empty ``orders``
topic; the demo's Iceberg catalog and warehouse are reset with it (a table whose offsets point past
a recreated topic would rightly refuse to ingest), and so is what was derived from them: the dbt
models' DuckDB file and the assets' event history in Dagster (materializations, observations, check
results). Dagster's run history is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STATE_DIR = ROOT / ".platform"
sys.path.insert(0, str(ROOT))

from platform_assets.cli.actions import CLI_ACTION_JOB  # noqa: E402
from platform_assets.demo import DemoProducerStats, run_demo_producer  # noqa: E402
from platform_assets.instance import (  # noqa: E402
    InstanceStorageError,
    cancel_active_runs,
    cancel_stopped_runs,
    create_storage,
)
from resources.embedded import EmbeddedBroker, find_free_port  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402
from resources.spark_connect import SparkConnectServer  # noqa: E402
from resources.stack_env import STACK_KEYS, publish_stack, withdraw_stack  # noqa: E402

DAGSTER_YAML = """\
# Written by scripts/dev.py for the embedded stack.
telemetry:
  enabled: false
nux:
  enabled: false
concurrency:
  pools:
    granularity: run  # a pool caps runs: one ingestion run per pipeline at a time
    default_limit: 1
  runs:
    max_concurrent_runs: 4
run_monitoring:  # the daemon fails runs that never start; killed runs: platform clear-dead-runs
  enabled: true
"""


def create_topic(kafka: KafkaResource, topic: str, partitions: int) -> None:
    """Create ``topic`` unless it exists."""
    from confluent_kafka.admin import NewTopic

    admin = kafka.get_admin_client()
    if topic in admin.list_topics(timeout=10).topics:
        return
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
    )
    for future in futures.values():
        future.result(15)


RESET = ("catalog.db", "warehouse", "analytics.duckdb", "analytics.duckdb.wal")
"""What each start deletes under the state folder: the demo's Iceberg catalog and warehouse,
and the dbt models built from them (``dbt/profiles.yml``: ``analytics.duckdb``)."""


def prepare_state(state_dir: Path) -> Path:
    """Reset the demo's data (:data:`RESET`) and the assets' history of it, keep Dagster's run
    history; create the Dagster instance's storage (once, before any process that opens it
    starts: :func:`platform_assets.instance.create_storage`, which repairs a storage two
    processes created at once); return DAGSTER_HOME.

    Raises:
        InstanceStorageError: a storage file it cannot repair; the message names the file.

    The DuckDB file goes with the catalog: kept, its ``orders_incremental`` would hold the last
    session's orders (absent from the new ``stg_orders``: the relationships test fails until the
    new session passes the old order ids) and its per-partition offsets (new records below them
    would never be loaded).
    """
    for stale in (state_dir / name for name in RESET):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    dagster_home = state_dir / "dagster_home"
    dagster_home.mkdir(parents=True, exist_ok=True)
    (dagster_home / "dagster.yaml").write_text(DAGSTER_YAML)
    for line in create_storage(dagster_home):
        print(f"repaired {line}", flush=True)
    forget_assets(dagster_home)
    return dagster_home


def forget_assets(dagster_home: Path) -> int:
    """Wipe the event history of every asset in ``dagster_home``; return how many were wiped.

    After the reset it describes a table and a topic that no longer exist. Kept, the table asset
    would count as materialized before the new session's first commit creates the table, so the
    dbt models' ``eager`` condition, which waits for missing upstream assets, would start a build
    that fails on the missing source. Wiped, the table is missing until that first commit and
    the models wait for it. Runs, sensor and schedule state are kept.
    """
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(dagster_home)) as instance:
        keys = list(instance.all_asset_keys())
        instance.wipe_assets(keys)
    return len(keys)


def stop_process_group(process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Interrupt a child's process group (as Ctrl-C would), then terminate, then kill, until no
    process of the group runs: not only its leader, which (``dagster dev``) exits before the run
    workers its code server started."""
    for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if not group_members(process.pid):
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + wait_s
        while group_members(process.pid) and time.monotonic() < deadline:
            process.poll()  # reaps the leader once it exits
            time.sleep(0.2)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5.0)  # the leader, reaped (a zombie is not a member)


def group_members(pgid: int) -> list[int]:
    """The running processes of process group ``pgid`` (zombies run nothing: left out)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    parser.add_argument("--ui-port", type=int, default=None, help="default: 3000 if free")
    parser.add_argument(
        "--rate", type=float, default=20.0, help="demo events per second (0: no demo producer)"
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="default: 9464 if free (platform metrics)"
    )
    parser.add_argument(
        "--spark",
        choices=("connect", "local"),
        default="connect",
        help="connect: one long-lived Spark Connect server for every run; local: a Spark per run",
    )
    args = parser.parse_args()

    state_dir = Path(args.state_dir).resolve()
    try:
        dagster_home = prepare_state(state_dir)
    except InstanceStorageError as exc:
        print(f"make dev: {exc}", file=sys.stderr, flush=True)
        return 2
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for stopping in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: terminal closed
        signal.signal(stopping, request_stop)

    spark_ui_port = find_free_port()  # the Spark UI: a job per batch, tagged with its pipeline
    spark_server = SparkConnectServer(
        state_dir / "logs",
        master="local[*]",
        conf={"spark.ui.enabled": "true", "spark.ui.port": str(spark_ui_port)},
    )
    kafka_dir = state_dir / "kafka"
    shutil.rmtree(kafka_dir, ignore_errors=True)  # a fresh demo topic, like the reset catalog
    with (
        EmbeddedBroker(
            log_path=state_dir / "logs" / "kafka.log", name="dev", data_dir=kafka_dir
        ) as broker,
        contextlib.ExitStack() as spark_stack,
    ):
        kafka = KafkaResource(bootstrap_servers=broker.bootstrap_servers)
        create_topic(kafka, "orders", args.partitions)
        stats = DemoProducerStats()
        producer_thread = threading.Thread(
            target=run_demo_producer,
            kwargs={
                "producer": kafka.get_producer(),
                "topic": "orders",
                "stop": stop,
                "rate_per_s": args.rate,
                "stats": stats,
            },
            name="demo-producer",
            daemon=True,
        )
        if args.rate > 0:  # 0: bring your own producer (scripts/dev_chaos.py)
            producer_thread.start()

        if args.spark == "connect":
            spark_stack.enter_context(spark_server)  # stopped after dagster, before the broker
        ui_port = args.ui_port or find_ui_port()
        metrics_port = args.metrics_port or find_port(METRICS_PORT)
        stack = {
            "DAGSTER_HOME": str(dagster_home),
            "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "PLATFORM_STATE_DIR": str(state_dir),
            # Runs attach to the Connect server (the configuration's spark.remote default).
            "PLATFORM_SPARK_REMOTE": spark_server.remote if args.spark == "connect" else "",
        }
        env = {
            **os.environ,
            **stack,
            # Alert sinks: empty = off. Set them in your shell to try a webhook or Slack.
            "PLATFORM_ALERT_WEBHOOK_URL": os.environ.get("PLATFORM_ALERT_WEBHOOK_URL", ""),
            "PLATFORM_SLACK_TOKEN": os.environ.get("PLATFORM_SLACK_TOKEN", ""),
            # Alerts link to the asset's checks or the run in this UI.
            "PLATFORM_UI_BASE_URL": os.environ.get(
                "PLATFORM_UI_BASE_URL", f"http://127.0.0.1:{ui_port}"
            ),
        }
        # The settings a second terminal needs, in the state folder and, for the default one,
        # where `platform` and `dagster` look by default (the repository root's .env): a second
        # stack (a test, a benchmark) never takes the place of the user's.
        shared = {**stack, **{k: os.environ[k] for k in STACK_KEYS if k in os.environ}}
        root = ROOT if state_dir == DEFAULT_STATE_DIR else None
        published = publish_stack(root, state_dir, shared)
        processes = start_dagster(state_dir, env, ui_port, metrics_port)
        print(f"Kafka:          {broker.bootstrap_servers}  (log: {broker.log_path})", flush=True)
        print(f"Iceberg:        SQLite catalog + warehouse under {state_dir}", flush=True)
        if args.spark == "connect":
            print(f"Spark Connect:  {spark_server.remote}  (log: {spark_server.log_path})")
            print(f"Spark UI:       http://127.0.0.1:{spark_ui_port}  (every batch's tasks)")
        else:
            print("Spark:          local, one session per run (--spark local)")
        print(f"Dagster UI:     http://127.0.0.1:{ui_port}  (log: {state_dir}/logs/dagster.log)")
        print(
            f"Metrics:        http://127.0.0.1:{metrics_port}/metrics  (Prometheus/OpenMetrics; "
            f"log: {state_dir}/logs/metrics.log)"
        )
        print(f"Second terminal: {published.describe()}")
        print(f"Demo producer:  orders topic, {args.rate:g} events/s. Ctrl-C stops everything.")
        sys.stdout.flush()
        died = False
        try:
            while not stop.wait(2.0):
                if processes.dagster.poll() is not None:
                    died = True
                    code = processes.dagster.returncode
                    print(f"dagster dev exited with {code}; stopping", flush=True)
                    break
        finally:
            print("Stopping: dagster, metrics, demo producer, Spark, broker...", flush=True)
            stop.set()
            withdraw_stack(published)
            for line in stop_dagster(processes, dagster_home):
                print(f"  {line}", flush=True)
            if producer_thread.is_alive():
                producer_thread.join(15)
            spark_stack.close()
            print(f"Stopped. Demo events produced: {stats.produced}", flush=True)
    # Stopped by the user: success. Stopped because dagster dev died on its own: failure.
    return 1 if died else 0


@dataclass
class DagsterProcesses:
    """What :func:`start_dagster` started: ``dagster dev`` (UI, daemon, code server) and the
    metrics endpoint (``platform metrics``), each in a process group of its own."""

    dagster: subprocess.Popen[bytes]
    metrics: subprocess.Popen[bytes]
    ui_port: int
    metrics_port: int


def start_dagster(
    state_dir: Path, env: dict[str, str], ui_port: int, metrics_port: int
) -> DagsterProcesses:
    """Start ``dagster dev`` and the metrics endpoint on ``env``'s ``DAGSTER_HOME``, whose storage
    :func:`prepare_state` created (both only open it: neither races the other to create it).

    Their logs go to ``state_dir/logs``. The default state folder's processes run in the
    repository root, where Dagster reads a ``.env`` (the user's, or the one this script
    publishes); any other state folder's run in that folder, so that a second stack never reads
    the settings of the user's.
    """
    cwd = ROOT if state_dir == DEFAULT_STATE_DIR else state_dir
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    dagster_command = [
        str(Path(sys.executable).with_name("dagster")),
        "dev",
        "-w",
        str(ROOT / "workspace.yaml"),
        "-h",
        "127.0.0.1",
        "-p",
        str(ui_port),
    ]
    # The metrics endpoint: the CLI a deployment runs, on the same configuration and instance.
    metrics_command = [
        str(Path(sys.executable).with_name("platform")),
        "metrics",
        "--host",
        "127.0.0.1",
        "--port",
        str(metrics_port),
    ]
    started = []
    for command, name in ((dagster_command, "dagster"), (metrics_command, "metrics")):
        with (state_dir / "logs" / f"{name}.log").open("ab") as log:
            started.append(
                subprocess.Popen(
                    command,
                    cwd=cwd,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return DagsterProcesses(started[0], started[1], ui_port, metrics_port)


STOP_MESSAGE = "make dev stopped (Ctrl-C): canceled by the user"


def stop_dagster(processes: DagsterProcesses, dagster_home: Path) -> list[str]:
    """Stop what :func:`start_dagster` started, its runs ending as canceled by the user; return
    a line per run it canceled (and one per error it met: it stops the processes whatever the
    instance says).

    In this order, so that no run is launched after it was looked at: ``dagster dev``'s daemon,
    the only launcher of queued runs and of sensor, schedule and backfill runs, is stopped
    first (:func:`stop_daemon`; the code server keeps the run workers until they end); then
    every run that has not finished is canceled (:func:`cancel_active_runs`: a queued one at
    once, one in progress or starting marked canceling, so the interrupt that stops it ends it
    as canceled, not failed); then the process group is interrupted. A run whose process was
    killed before it could say so is marked canceled once every process is gone. An ingestion
    run stopped mid-commit loses and duplicates nothing: its commit either landed with its
    offsets or did not (docs/reliability.md), and the next start reads on from the table's
    offsets.
    """
    from dagster import DagsterInstance

    leave = frozenset([CLI_ACTION_JOB])
    lines: list[str] = []
    try:
        stop_daemon(processes.dagster)
        with DagsterInstance.from_config(str(dagster_home)) as instance:
            lines += cancel_active_runs(instance, STOP_MESSAGE, leave_jobs=leave)
    except Exception as exc:  # stop the processes and sweep all the same
        lines.append(f"could not cancel the runs before stopping ({exc}); canceled after")
    finally:  # whatever the instance said, nothing of ours is left running
        stop_process_group(processes.dagster)
        stop_process_group(processes.metrics)
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        lines += cancel_stopped_runs(instance, STOP_MESSAGE, leave_jobs=leave)
    return lines


DAEMON_MODULE = "dagster._daemon"  # dagster dev starts its daemon as python -m dagster._daemon


def stop_daemon(dagster_dev: subprocess.Popen[bytes], timeout_s: float = 35.0) -> None:
    """Stop ``dagster dev``'s daemon, and wait until it has exited: it ends the sensor,
    schedule and run-queue ticks in flight, each of which may still launch a run.

    ``dagster dev`` alone is interrupted (not its process group), which shuts its daemon down
    as on Ctrl-C; should ``dagster dev`` be gone already, or its daemon still run after a few
    seconds, the daemon is interrupted itself; past ``timeout_s`` it is killed (a killed daemon
    resumes its ticks on the next start). No daemon (it exited on its own): nothing to wait
    for."""
    dagster_dev.send_signal(signal.SIGINT)  # nothing once it has exited and been reaped
    deadline = time.monotonic() + timeout_s
    nudge_at = time.monotonic() + (0.0 if dagster_dev.poll() is not None else 5.0)
    while daemons := [pid for pid in group_members(dagster_dev.pid) if is_daemon(pid)]:
        now = time.monotonic()
        if now > deadline or now > nudge_at:
            sig = signal.SIGKILL if now > deadline else signal.SIGINT
            for pid in daemons:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            if sig == signal.SIGKILL:
                return
            nudge_at = deadline  # interrupted once
        time.sleep(0.2)


def is_daemon(pid: int) -> bool:
    """Whether process ``pid`` is a Dagster daemon (``python -m dagster._daemon run``)."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False  # gone meanwhile
    return DAEMON_MODULE.encode() in arguments


def find_ui_port() -> int:
    """Return 3000 when it is free, else any free loopback port."""
    return find_port(3000)


METRICS_PORT = 9464  # platform metrics' default (OpenTelemetry's Prometheus exporter's port)


def find_port(preferred: int) -> int:
    """Return ``preferred`` when it is free on loopback, else any free loopback port."""
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            return find_free_port()


if __name__ == "__main__":
    raise SystemExit(main())
