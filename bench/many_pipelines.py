"""Many pipelines on `make dev`'s stack: freshness, cost and processes per pipeline (R52).

    .venv/bin/python bench/many_pipelines.py --pipelines 1 10 50 --minutes 10 [--rate 10]

Path: for each count N, scripts/dev.py starts `make dev`'s stack exactly as the README does
(broker, Spark Connect, `dagster dev` with its daemon), with the demo producer off and
``PLATFORM_PIPELINES_FILE`` naming N streaming pipelines shaped like the shipped ``orders``
(JSON order events, 2 partitions each, ``created_at`` day partitions, a 15 s freshness target:
a commit every 3.75 s). The topics are created before the code location loads; one producer
writes ``--rate`` events/s to each topic for ``--minutes``; then the lag must reach 0.

Printed per N: produce -> queryable p50 and p95 (per pipeline; the worst pipeline's p95 and how
many met the 15 s target) over the records produced after the first minute (start-up excluded);
commits per second; the stack's CPU (cores busy, from the process tree's CPU time) and RSS
(average of 5 s samples), whole and per pipeline; the processes of the stack and the Dagster runs
in progress (run slots); and the exactly-once read-back: every pipeline's table read with
pyiceberg holds each produced key once.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import yaml  # noqa: E402

from ingestion.health.latency import Latency, measure_latency  # noqa: E402
from platform_assets.demo import encode_event, make_order_event  # noqa: E402
from resources.embedded import find_free_port  # noqa: E402
from resources.iceberg import IcebergCatalogResource  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402
from tests.support.dev_stack import start_dev_stack  # noqa: E402

SHIPPED = ROOT / "platform_assets" / "pipelines.yaml"
TARGET_S = 15
WARMUP_S = 60


def write_pipelines(workdir: Path, count: int) -> tuple[Path, list[str]]:
    """N copies of the shipped ``orders`` pipeline, each on its own topic, table and group."""
    (orders,) = yaml.safe_load(SHIPPED.read_text())["pipelines"]
    names = [f"p{i:02d}" for i in range(count)]
    pipelines = [
        {
            **orders,
            "name": name,
            "topic": name,
            "table": f"bench.{name}",
            "consumer_group_id": f"platform-{name}",
            "freshness_target_seconds": TARGET_S,
        }
        for name in names
    ]
    path = workdir / "pipelines.yaml"
    path.write_text(yaml.safe_dump({"pipelines": pipelines}, sort_keys=False))
    return path, names


@dataclass
class Load:
    """What the producer acknowledged, per topic: the keys."""

    acked: dict[str, set[str]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    errors: int = 0


def produce(kafka: KafkaResource, topics: list[str], rate: float, load: Load) -> None:
    """``rate`` events/s to each topic, in ticks of 0.25 s; keys unique per topic."""
    import random

    producer = kafka.get_producer(**{"linger.ms": 20})
    rng, sequence, tick = random.Random(11), 0, 0.25
    for topic in topics:
        load.acked[topic] = set()

    def acknowledge(error: Any, message: Any) -> None:
        if error is not None:
            load.errors += 1
        else:
            load.acked[message.topic()].add(message.key().decode())

    carry = 0.0
    while not load.stop.is_set():
        started = time.monotonic()
        carry += rate * tick
        batch, carry = int(carry), carry - int(carry)
        for topic in topics:
            for _ in range(batch):
                event = make_order_event(rng, sequence)
                sequence += 1
                producer.produce(
                    topic,
                    key=event["order_id"].encode(),
                    value=encode_event(event),
                    on_delivery=acknowledge,
                )
        producer.poll(0)
        load.stop.wait(max(0.0, tick - (time.monotonic() - started)))
    producer.flush(30)


@dataclass
class Usage:
    """The stack's process tree, sampled every 5 s."""

    rss: list[int] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    by_kind: dict[str, float] = field(default_factory=dict)  # CPU-seconds per process kind


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def kind_of(process: psutil.Process) -> str:
    """What a process of the stack is: a JVM's main class, a Dagster process's role, a Python
    module or script (the CPU table's rows)."""
    try:
        args = process.cmdline()
    except psutil.Error:
        return "gone"
    if not args:
        return "?"
    joined = " ".join(args)
    if Path(args[0]).name == "java":
        operands = [
            a
            for before, a in itertools.pairwise(args)
            if not a.startswith("-") and before not in ("-cp", "-classpath", "--class-path")
        ]
        main_class = operands[0].rsplit(".", 1)[-1] if operands else "?"
        return f"java {main_class}" + (" (connect)" if "SparkConnectServer" in joined else "")
    for role in ("execute_run", "execute_step", "grpc", "dagster-daemon", "dagster_webserver"):
        if role in joined:
            return f"dagster {role}"
    for option, operand in itertools.pairwise(args):
        if option in ("-m", "-c"):
            return f"python {option} {operand.split()[0] if option == '-m' else ''}".strip()
    operands = [a for a in args[1:] if not a.startswith("-")]
    return Path(operands[0] if operands else args[0]).name


def cpu_seconds(
    processes: list[psutil.Process], seen: dict[int, float], kinds: dict[int, str]
) -> None:
    """Record each process's CPU seconds so far (a process that ended keeps its last) and,
    the first time it is seen, its kind."""
    for process in processes:
        try:
            times = process.cpu_times()
            seen[process.pid] = times.user + times.system + times.children_user
        except psutil.Error:
            continue
        if process.pid not in kinds:
            kinds[process.pid] = kind_of(process)


def sample(pid: int, usage: Usage, stop: threading.Event) -> None:
    first: dict[int, float] = {}
    kinds: dict[int, str] = {}
    cpu_seconds(tree(pid), first, kinds)
    started, last = time.monotonic(), dict(first)
    while not stop.wait(5):
        processes = tree(pid)
        rss = 0
        for process in processes:
            try:
                rss += process.memory_info().rss
            except psutil.Error:
                continue
        usage.rss.append(rss)
        usage.processes.append(len(processes))
        cpu_seconds(processes, last, kinds)
    usage.cpu_s = sum(last.values()) - sum(first.get(pid, 0.0) for pid in last)
    usage.wall_s = time.monotonic() - started
    for process_id, seconds in last.items():
        kind = kinds.get(process_id, "?")
        used = seconds - first.get(process_id, 0.0)
        usage.by_kind[kind] = usage.by_kind.get(kind, 0.0) + used


def profile_worker(root: int, py_spy: str, seconds: float, out: Path) -> Path | None:
    """Record the stream worker (the busiest ``execute_run`` process under ``root``) with
    py-spy for ``seconds``, native frames off, into ``out`` (collapsed stacks); None when no
    worker runs."""
    runs = [p for p in tree(root) if kind_of(p) == "dagster execute_run"]
    if not runs:
        return None
    busiest = max(runs, key=lambda p: sum(p.cpu_times()[:2]))
    command = [py_spy, "record", "--pid", str(busiest.pid), "--duration", str(int(seconds))]
    command += ["--format", "raw", "--output", str(out), "--nonblocking", "--subprocesses"]
    subprocess.run(command, check=True, capture_output=True, timeout=seconds + 120)
    return out


def summarize_profile(collapsed: Path, top: int = 25) -> list[str]:
    """The profile's lines: the share of the busy samples (py-spy leaves idle threads out) under
    each function of :data:`PROFILED` (once per stack, whatever its line), the busiest first."""
    total, under = 0, dict[str, int]()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        total += samples
        functions = {re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")}
        frames = {f for f in functions if any(m in f for m in PROFILED)}
        for frame in frames:
            under[frame] = under.get(frame, 0) + samples
    ranked = sorted(under.items(), key=lambda item: -item[1])[:top]
    return [f"{100 * n / total:5.1f}%  {frame}" for frame, n in ranked]


PROFILED = ("ingestion/", "platform_assets/", "resources/", "dagster/", "pyiceberg/", "pyspark/")
"""The packages whose functions the profile summary names (paths in py-spy's frames)."""


@contextmanager
def stack(workdir: Path, pipelines: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`make dev` (scripts/dev.py), demo producer off; yield (process, the broker's address)."""
    env = {**os.environ, "PLATFORM_PIPELINES_FILE": str(pipelines)}
    env.pop("PLATFORM_CONFIG", None)
    process = start_dev_stack(workdir / "platform", find_free_port(), env, rate=0)
    assert process.stdout is not None
    bootstrap = ""
    try:
        for line in process.stdout:
            if line.startswith("Kafka:"):
                bootstrap = line.split()[1]
            if line.startswith("Dagster UI:"):
                break
        threading.Thread(target=process.stdout.read, daemon=True).start()
        yield process, bootstrap
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(180)


def runs_in_progress(dagster_home: Path) -> dict[str, int]:
    """Dagster runs STARTED now, by job."""
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    with DagsterInstance.from_config(str(dagster_home)) as instance:
        runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
        counts: dict[str, int] = {}
        for run in runs:
            counts[run.job_name] = counts.get(run.job_name, 0) + 1
        return counts


def measure(
    count: int, minutes: float, rate: float, py_spy: str | None = None, profile_s: float = 60
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"many-{count}-"))
    pipelines, names = write_pipelines(workdir, count)
    print(f"\n{count} pipelines (directory {workdir})", flush=True)
    with stack(workdir, pipelines) as (process, bootstrap):
        kafka = KafkaResource(bootstrap_servers=bootstrap)
        from confluent_kafka.admin import NewTopic

        admin = kafka.get_admin_client()
        for future in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
            future.result(30)
        load, usage, stop_sampling = Load(), Usage(), threading.Event()
        producer = threading.Thread(target=produce, args=(kafka, names, rate, load), daemon=True)
        sampler = threading.Thread(
            target=sample, args=(process.pid, usage, stop_sampling), daemon=True
        )
        started_ms = int(time.time() * 1000)
        producer.start()
        sampler.start()
        slots: list[dict[str, int]] = []
        deadline = time.monotonic() + minutes * 60
        profile: list[str] = []
        while time.monotonic() < deadline:
            time.sleep(min(30, max(0.0, deadline - time.monotonic())))
            slots.append(runs_in_progress(workdir / "platform" / "dagster_home"))
            warm = time.time() * 1000 > started_ms + WARMUP_S * 1000
            if py_spy and warm and not profile:
                out = profile_worker(process.pid, py_spy, profile_s, workdir / "worker.txt")
                profile = summarize_profile(out) if out else ["no stream worker ran"]
                print(f"py-spy, the stream worker for {profile_s:.0f} s ({out}):", flush=True)
                print("\n".join(profile), flush=True)
        stop_sampling.set()
        sampler.join(30)
        load.stop.set()
        producer.join(60)
        until_ms = int(time.time() * 1000)
        iceberg = IcebergCatalogResource(state_dir=str(workdir / "platform"))
        catalog = iceberg.load_catalog()
        drained = drain(catalog, names, load, timeout_s=300)
        results: list[tuple[str, Latency | None, int, bool]] = []
        for name in names:
            if not catalog.table_exists(f"bench.{name}"):
                results.append((name, None, 0, False))
                continue
            table = catalog.load_table(f"bench.{name}")
            latency = measure_latency(
                table, f"platform-{name}", started_ms + WARMUP_S * 1000, until_ms
            )
            keys = table.scan(selected_fields=("order_id",)).to_arrow().column(0).to_pylist()
            exact = len(keys) == len(set(keys)) and set(keys) == load.acked[name]
            results.append((name, latency, len(table.metadata.snapshots), exact))
    p95s = [lat.p95_s for _, lat, _, _ in results if lat is not None and lat.records]
    p50s = [lat.p50_s for _, lat, _, _ in results if lat is not None and lat.records]
    commits = [lat.commits for _, lat, _, _ in results if lat is not None]
    window_s = (until_ms - started_ms) / 1000 - WARMUP_S
    slot_peak = max((sum(s.values()) for s in slots), default=0)
    figures = {
        "pipelines": count,
        "p50_median_s": statistics.median(p50s) if p50s else float("nan"),
        "p95_median_s": statistics.median(p95s) if p95s else float("nan"),
        "p95_worst_s": max(p95s) if p95s else float("nan"),
        "met_target": sum(1 for p in p95s if p <= TARGET_S),
        "measured": len(p95s),
        "commits_per_s": sum(commits) / window_s if window_s > 0 else 0.0,
        "cpu_cores": usage.cpu_s / usage.wall_s if usage.wall_s else 0.0,
        "cpu_s_per_commit": (usage.cpu_s / usage.wall_s) * window_s / sum(commits)
        if usage.wall_s and sum(commits)
        else float("nan"),
        "cpu_s_by_process": {
            kind: round(seconds, 1)
            for kind, seconds in sorted(usage.by_kind.items(), key=lambda item: -item[1])
        },
        "rss_mb": statistics.mean(usage.rss) / 2**20 if usage.rss else 0.0,
        "processes": max(usage.processes, default=0),
        "run_slots": slot_peak,
        "runs_by_job": slots[-1] if slots else {},
        "exact": sum(1 for *_, exact in results if exact),
        "drained_s": drained,
        "produce_errors": load.errors,
    }
    print(figures, flush=True)
    return figures


def drain(catalog: Any, names: list[str], load: Load, timeout_s: float) -> float:
    """Seconds until every table holds every acknowledged record (or ``nan``)."""
    started = time.monotonic()
    waiting = list(names)
    while waiting and time.monotonic() - started < timeout_s:
        name = waiting[0]
        table = f"bench.{name}"
        if catalog.table_exists(table):
            rows = catalog.load_table(table).scan(selected_fields=("order_id",)).count()
            if rows >= len(load.acked[name]):
                waiting.pop(0)
                continue
        time.sleep(2)
    return time.monotonic() - started if not waiting else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=10.0, help="events/s per pipeline")
    parser.add_argument(
        "--py-spy",
        help="a py-spy binary: profile the stream worker once the first minute has passed",
    )
    parser.add_argument("--profile-seconds", type=float, default=60.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"stopped by signal {signum}"))
    rows = [
        measure(count, args.minutes, args.rate, args.py_spy, args.profile_seconds)
        for count in args.pipelines
    ]
    print(
        f"\n{'pipelines':>9} {'p50 med':>8} {'p95 med':>8} {'p95 worst':>9} {'met 15s':>8} "
        f"{'commits/s':>9} {'cpu/commit':>10} {'cores':>6} {'RSS MB':>7} {'MB/pipe':>8} "
        f"{'procs':>6} "
        f"{'slots':>6} {'exact':>6}"
    )
    for row in rows:
        n = row["pipelines"]
        print(
            f"{n:>9} {row['p50_median_s']:>8.1f} {row['p95_median_s']:>8.1f} "
            f"{row['p95_worst_s']:>9.1f} {row['met_target']:>4}/{row['measured']:<3} "
            f"{row['commits_per_s']:>9.2f} {row['cpu_s_per_commit']:>10.2f} "
            f"{row['cpu_cores']:>6.2f} {row['rss_mb']:>7.0f} "
            f"{row['rss_mb'] / n:>8.1f} {row['processes']:>6} {row['run_slots']:>6} "
            f"{row['exact']:>3}/{n:<3}"
        )
    for row in rows:
        print(f"\nCPU-seconds by process, {row['pipelines']} pipelines:")
        for kind, seconds in row["cpu_s_by_process"].items():
            print(f"  {seconds:>8.1f}  {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
