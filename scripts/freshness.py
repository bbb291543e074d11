"""Produce -> queryable on the real dev stack: p50/p95/max from the table, and the commit interval.

Starts ``make dev``'s stack (scripts/dev.py: broker, catalog, demo producer at ``--rate``,
``dagster dev`` with its daemon: sensors, runs, commits), waits for its first commit, measures
the records produced during the next ``--minutes``, prints the figures and stops the stack.
With ``--attach STATE_DIR`` it measures a running stack instead, producing ``--rate`` extra
events/s to ``orders`` at ``$KAFKA_BOOTSTRAP_SERVERS`` (0: only watch the demo producer).
With ``--target SECONDS`` the started stack runs the shipped ``orders`` pipeline with that
``freshness_target_seconds`` instead of the shipped 15 s (a pipelines file passed through
``PLATFORM_PIPELINES_FILE``): at or above ``RUN_PER_COMMIT_FLOOR_SECONDS`` it is ingested run per
commit (lag sensor -> Dagster run -> commit), which is how the floor is measured.

Latency per record = commit time of the first snapshot whose offsets cover it minus its Kafka
timestamp (ingestion/health/latency.py); nothing else of the stack is changed for the measurement.

    python scripts/freshness.py --rate 20 --minutes 3
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingestion.health.latency import measure_latency  # noqa: E402
from ingestion.health.state import commits_of  # noqa: E402
from resources.embedded import find_free_port  # noqa: E402
from resources.iceberg import IcebergCatalogResource  # noqa: E402

TABLE, GROUP = "demo.orders", "platform-orders"


def first_commit_ms(catalog: IcebergCatalogResource, timeout_s: float) -> int:
    """Wait for the table's first commit; its commit time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        loaded = catalog.load_catalog()
        if loaded.table_exists(TABLE):
            commits = commits_of(loaded.load_table(TABLE), GROUP, limit=1)
            if commits:
                return commits[0].timestamp_ms
        time.sleep(1)
    raise SystemExit(f"no commit to {TABLE} within {timeout_s:.0f} s")


def write_pipelines(state_dir: Path, target: float) -> Path:
    """The shipped pipelines file with ``orders``' freshness target set to ``target``."""
    import yaml

    document = yaml.safe_load((ROOT / "platform_assets" / "pipelines.yaml").read_text())
    for pipeline in document["pipelines"]:
        if pipeline["name"] == "orders":
            pipeline["freshness_target_seconds"] = target
    path = state_dir / "pipelines.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def start_stack(state_dir: Path, rate: float, target: float | None) -> subprocess.Popen[str]:
    """scripts/dev.py, as ``make dev`` runs it; returns once it reset the demo catalog (its
    banner is printed after that: opening the catalog earlier would race the reset)."""
    command = [sys.executable, str(ROOT / "scripts" / "dev.py"), "--state-dir", str(state_dir)]
    command += ["--ui-port", str(find_free_port()), "--rate", f"{rate:g}"]
    env = dict(os.environ)
    if target is not None:
        env["PLATFORM_PIPELINES_FILE"] = str(write_pipelines(state_dir, target))
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("Dagster UI:"):
            break
    return process


def produce_extra(rate: float, stop: threading.Event) -> None:
    """Demo events at ``rate``/s to the attached stack's ``orders`` topic."""
    from platform_assets.demo import run_demo_producer
    from resources.kafka import KafkaResource

    kafka = KafkaResource(bootstrap_servers=os.environ["KAFKA_BOOTSTRAP_SERVERS"])
    run_demo_producer(kafka.get_producer(), "orders", stop, rate_per_s=rate, duplicate_ratio=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0, help="events per second")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--attach", help="state dir of a running stack (default: start one)")
    parser.add_argument("--settle-seconds", type=float, default=60.0)
    parser.add_argument(
        "--target", type=float, help="orders' freshness_target_seconds (default: shipped)"
    )
    args = parser.parse_args()

    stack, stop = None, threading.Event()
    if args.attach:
        state_dir = Path(args.attach)
        if args.rate > 0:
            threading.Thread(target=produce_extra, args=(args.rate, stop), daemon=True).start()
    else:
        state_dir = Path(tempfile.mkdtemp(prefix="freshness-"))
        stack = start_stack(state_dir, args.rate, args.target)
    catalog = IcebergCatalogResource(state_dir=str(state_dir))
    try:
        since_ms = max(first_commit_ms(catalog, 300), int(time.time() * 1000))
        print(
            f"stack committing; measuring {args.minutes:g} min at {args.rate:g} events/s",
            flush=True,
        )
        until_ms = since_ms + int(args.minutes * 60_000)
        time.sleep(max(0.0, until_ms / 1000 - time.time()))
        stop.set()
        time.sleep(args.settle_seconds)  # the window's last records commit
        table = catalog.load_catalog().load_table(TABLE)
        latency = measure_latency(table, GROUP, since_ms, until_ms)
    finally:
        stop.set()
        if stack is not None:
            stack.send_signal(signal.SIGINT)
            stack.communicate(timeout=120)
    print(f"rate {args.rate:g} events/s, {args.minutes:g} min: {latency.line()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
