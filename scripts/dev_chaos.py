"""A dirty stream on ``make dev`` while operators act, failover included (docs/operate.md).

    .venv/bin/python scripts/dev_chaos.py [--minutes 10] [--rate 50] [--bad 0.01] [--seed 5]

Run by hand, not in CI. It starts ``make dev``'s stack (scripts/dev.py: broker, Spark Connect,
``dagster dev`` with its daemon; the demo producer off) with a platform configuration
(``$PLATFORM_CONFIG``) that gives the shipped ``orders`` pipeline, still a stream (freshness
target 15 s), a dead-letter topic that does not exist yet (``orders-dlq``) and a replica ``dr``:
a second embedded broker, fed by real MirrorMaker 2 (tests/support/mirror_maker.py, default
naming: dr's ``primary.orders``). It produces order events with unique keys, ``created_at``
spread over 30 days (many day partitions), ``--bad`` of them malformed JSON, at ``--rate``/s, and
operators act while the daemon's stream ingests, as a user does: Dagster jobs launched in the
stack's instance through the UI's GraphQL API (what the UI's Launch button sends), and the
``platform`` CLI. The timeline, as fractions of ``--minutes``:

- 0.10 ``reset_offsets`` job: back 45 s (the re-read range holds dead letters already copied);
- 0.20 ``maintain_tables`` job, without compaction: with compaction it ran 16 minutes at this
  point (about 3,500 small files from 2 minutes of a stream writing 30 day partitions per
  commit, measured in an earlier run), so it runs expiry and orphan removal (see 0.63);
- 0.28 ``migrate_group`` job to ``platform-orders-v2``, then the pipelines file names the new
  group and the code location is reloaded (the UI's Reload);
- 0.38 ``failover`` job to ``dr``, a planned switchover: producers pause, MM2 copies everything
  and checkpoints the group, the forward flow stops, producers move to dr's ``primary.orders``,
  the job runs (again while it is refused; without the pause, the table is ahead of MM2's copy
  and the job refuses, naming the records the replica lacks);
- 0.55 failback: the reverse flow (dr -> primary, identity naming) starts, producers return to
  the primary's ``orders``, the ``failover`` job to ``primary`` runs until its plan is accepted;
- 0.63 ``maintain_tables`` job again, on the failback's route, without compaction (a stream
  writing 30 day partitions per commit has about 10,000 data files after 10 minutes, and
  compacting them takes longer than the rest of the run: measured, not hidden, see
  docs/operate.md "Maintenance"); expiry and orphan removal bound the snapshot counts;
- 0.70 the reverse copy drained: the reverse flow stops, the ``failover`` job with
  ``complete: true``;
- 0.80 ``platform reset orders --to timestamp:<30 s ago> --apply`` from the CLI, which holds
  the pipeline as the jobs do (the worker stops its lane between two commits);
- 0.90 ``maintain_tables`` job, without compaction, as at 0.63.

Then it stops producing, waits for the lag to reach 0, and prints the oracle from plain reads:
every acknowledged record once, in the table or (malformed) in the quarantine table, by its own
key; each malformed record's letter once, read to the end by a plain ``read_committed`` consumer
of ``orders-dlq`` on both clusters (a switch copies what the cluster it leaves owed there); the
quarantine table's snapshot count each minute; and every Dagster run by job and outcome.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from ingestion.spec.pipeline import load_pipeline_specs  # noqa: E402
from platform_assets.demo import encode_event, make_order_event  # noqa: E402
from platform_assets.state import read_pipeline_state  # noqa: E402
from resources.embedded import EmbeddedBroker, find_free_port  # noqa: E402
from resources.iceberg import IcebergCatalogResource  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402
from tests.support.dev_stack import start_dev_stack  # noqa: E402
from tests.support.mirror_maker import MirrorMaker, count_records, wait_for  # noqa: E402

PIPELINE, DEAD_LETTERS, NEW_GROUP = "orders", "orders-dlq", "platform-orders-v2"
LOCATION = "platform_assets.definitions:defs"  # Dagster's name of workspace.yaml's location
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}


@dataclass
class Chaos:
    """State shared by the producer, the sampler and the operator."""

    target: tuple[str, str]  # (bootstrap servers, topic) producers write to now
    acknowledged: set[str] = field(default_factory=set)
    bad: set[str] = field(default_factory=set)
    snapshots: list[tuple[int, int]] = field(
        default_factory=list
    )  # (data, quarantine), each minute
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    producing: threading.Event = field(default_factory=threading.Event)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def produce(chaos: Chaos, rate: float, bad_ratio: float, seed: int) -> None:
    """Order events with unique keys over 30 days, ``bad_ratio`` malformed, to ``chaos.target``
    (flushed before the target may move: only acknowledged records are expected)."""
    from confluent_kafka import Producer

    rng, sequence, now = random.Random(seed), 0, dt.datetime.now(tz=dt.UTC)
    producers: dict[str, Producer] = {}

    def acknowledge(error: Any, message: Any) -> None:
        if error is None:
            with chaos.lock:
                chaos.acknowledged.add(message.key().decode())
                if message.value() == b"{not json":
                    chaos.bad.add(message.key().decode())

    while not chaos.stop.is_set():
        if not chaos.producing.wait(0.2):
            continue
        bootstrap, topic = chaos.target
        producer = producers.setdefault(bootstrap, Producer({"bootstrap.servers": bootstrap}))
        started = time.monotonic()
        for _ in range(max(1, round(rate / 10))):
            event = make_order_event(rng, sequence, now - dt.timedelta(days=sequence % 30))
            value = b"{not json" if rng.random() < bad_ratio else encode_event(event)
            key = f"chaos-{sequence:09d}".encode()
            producer.produce(topic, key=key, value=value, on_delivery=acknowledge)
            sequence += 1
        producer.flush(30)
        time.sleep(max(0.0, 0.1 - (time.monotonic() - started)))


class Operator:
    """Dagster jobs launched in the stack's instance through the UI's GraphQL API, and the CLI."""

    def __init__(self, port: int, dagster_home: Path, env: dict[str, str]) -> None:
        from dagster_graphql import DagsterGraphQLClient

        self.client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        self.dagster_home, self.env = dagster_home, env
        self.outcomes: Counter[str] = Counter()

    def launch(self, job: str, op: str, config: dict[str, Any]) -> tuple[str, str]:
        """Launch ``job`` and wait for it: (status, the step's error when it failed)."""
        run_id = self.client.submit_job_execution(job, run_config={"ops": {op: {"config": config}}})
        status = "QUEUED"
        for _ in range(900):
            status = self.client.get_run_status(run_id).value
            if status in FINISHED:
                break
            time.sleep(1)
        self.outcomes[f"{job}: {status}"] += 1
        return status, self.failure(run_id) if status != "SUCCESS" else ""

    def failure(self, run_id: str) -> str:
        """The first error line a failed run recorded."""
        from dagster import DagsterEventType, DagsterInstance

        with DagsterInstance.from_config(str(self.dagster_home)) as instance:
            for kind in (DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE):
                for record in instance.all_logs(run_id, of_type=kind):
                    event = record.dagster_event
                    error = getattr(event.event_specific_data, "error", None) if event else None
                    if error is not None:
                        return error.message.strip().splitlines()[0]
                    if record.message:
                        return record.message
        return "no failure recorded"

    def until_success(
        self, what: str, job: str, op: str, config: dict[str, Any], attempts: int, pause_s: float
    ) -> None:
        """Launch until a run succeeds (a refusal says why: print it, wait, launch again)."""
        started = time.monotonic()
        for attempt in range(1, attempts + 1):
            status, error = self.launch(job, op, config)
            if status == "SUCCESS":
                say(f"   {what}: done after {attempt} run(s), {time.monotonic() - started:.0f} s")
                return
            say(f"   {what}: run {attempt} {status}: {error[:300]}")
            time.sleep(pause_s)
        raise RuntimeError(f"{what} did not succeed in {attempts} runs")

    def cli(self, what: str, args: list[str], attempts: int, pause_s: float) -> None:
        """``platform ARGS`` as an operator types it, again while it is refused."""
        started = time.monotonic()
        for attempt in range(1, attempts + 1):
            done = subprocess.run(
                [str(Path(sys.executable).with_name("platform")), *args],
                env=self.env,
                capture_output=True,
                text=True,
                check=False,
            )
            self.outcomes[f"platform {args[0]}: exit {done.returncode}"] += 1
            if done.returncode == 0:
                say(
                    f"   {what}: done after {attempt} attempt(s), "
                    f"{time.monotonic() - started:.0f} s; {done.stdout.strip().splitlines()[-1]}"
                )
                return
            lines = (done.stderr or done.stdout).strip().splitlines()
            say(f"   {what}: attempt {attempt} refused: {(lines or ['?'])[-1][:300]}")
            time.sleep(pause_s)
        raise RuntimeError(f"{what} did not succeed in {attempts} attempts")


def write_config(workdir: Path, dr: str) -> Path:
    """The shipped ``orders`` pipeline with a dead-letter topic and replica ``dr``; the
    configuration naming it (everything else as ``make dev`` has it)."""
    document = yaml.safe_load((ROOT / "platform_assets" / "pipelines.yaml").read_text())
    (orders,) = [p for p in document["pipelines"] if p["name"] == PIPELINE]
    orders["dead_letter_topic"] = DEAD_LETTERS  # not created: the first copy creates it
    orders["replicas"] = [{"name": "dr", "source_alias": "primary", "target_alias": "dr"}]
    # 3 minutes of history (a stream keeps 30 by default): within the run, maintenance must
    # bring both tables' snapshot counts back down, or they are not bounded.
    orders["snapshot_retention_hours"] = 0.05
    pipelines = workdir / "pipelines.yaml"
    pipelines.write_text(yaml.safe_dump({"pipelines": [orders]}, sort_keys=False))
    config = workdir / "platform.yaml"
    config.write_text(
        yaml.safe_dump(
            {"replicas": {"dr": {"bootstrap_servers": dr}}, "pipelines_file": str(pipelines)}
        )
    )
    return config


def use_group(workdir: Path, group: str) -> None:
    """Name ``group`` in the pipelines file (after the migration, as its docs say)."""
    path = workdir / "pipelines.yaml"
    document = yaml.safe_load(path.read_text())
    document["pipelines"][0]["consumer_group_id"] = group
    path.write_text(yaml.safe_dump(document, sort_keys=False))


def start_stack(
    state_dir: Path, port: int, env: dict[str, str]
) -> tuple[subprocess.Popen[str], str]:
    """scripts/dev.py as ``make dev`` runs it, demo producer off; (process, its bootstrap)."""
    process = start_dev_stack(state_dir, port, env, rate=0)
    assert process.stdout is not None
    bootstrap = ""
    for line in process.stdout:
        if line.startswith("Kafka:"):
            bootstrap = line.split()[1]
        if line.startswith("Dagster UI:"):
            break
    threading.Thread(target=process.stdout.read, daemon=True).start()  # keep the pipe drained
    return process, bootstrap


def sample(chaos: Chaos, iceberg: IcebergCatalogResource, tables: tuple[str, str]) -> None:
    """The data and quarantine tables' snapshot counts, each minute."""
    while not chaos.stop.wait(60):
        catalog = iceberg.load_catalog()
        if all(catalog.table_exists(t) for t in tables):
            data, quarantine = (len(catalog.load_table(t).metadata.snapshots) for t in tables)
            chaos.snapshots.append((data, quarantine))


def drain(
    kafka: KafkaResource, iceberg: IcebergCatalogResource, workdir: Path, timeout_s: float
) -> float:
    """Seconds until the route's lag is 0 (producers stopped)."""
    (spec,) = load_pipeline_specs(workdir / "pipelines.yaml")
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if sum(read_pipeline_state(spec, kafka, iceberg).lag().values()) == 0:
            return time.monotonic() - started
        time.sleep(3)
    return float("nan")


def read_letters(bootstrap: str) -> Counter[str]:
    """``orders-dlq`` on one cluster read to its end by a plain read_committed consumer, by key."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-dlq-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    letters: Counter[str] = Counter()
    try:
        topic = consumer.list_topics(DEAD_LETTERS, timeout=10).topics[DEAD_LETTERS]
        if topic.error is not None:
            return letters
        consumer.assign([TopicPartition(DEAD_LETTERS, p, 0) for p in topic.partitions])
        while batch := consumer.consume(1000, timeout=5):
            letters.update((m.key() or b"").decode() for m in batch if m.error() is None)
    finally:
        consumer.close()
    return letters


def verdict(chaos: Chaos, iceberg: IcebergCatalogResource, clusters: dict[str, str]) -> bool:
    """Every acknowledged record once (table or quarantine) and each bad one's letter once."""
    (spec,) = load_pipeline_specs(ROOT / "platform_assets" / "pipelines.yaml")
    catalog = iceberg.load_catalog()
    keys = catalog.load_table(spec.table).scan(selected_fields=("_kafka_key",)).to_arrow()
    found = Counter(keys.column("_kafka_key").to_pylist())
    quarantine = catalog.load_table(spec.quarantine_table)
    rows = quarantine.scan(selected_fields=("_kafka_key",)).to_arrow()
    bad = Counter(k.decode() for k in rows.column("_kafka_key").to_pylist())
    letters: Counter[str] = Counter()
    per_cluster = {}
    for name, bootstrap in clusters.items():
        read = read_letters(bootstrap)
        per_cluster[name] = sum(read.values())
        letters += read
    every = found + bad
    figures = {
        "acknowledged": len(chaos.acknowledged),
        "acknowledged malformed": len(chaos.bad),
        "table rows": sum(found.values()),
        "quarantine rows": sum(bad.values()),
        "lost": len(chaos.acknowledged - set(every)),
        "duplicated": sum(n - 1 for n in every.values() if n > 1),
        "malformed not in the quarantine table": len(chaos.bad - set(bad)),
        "not acknowledged but ingested": len(set(every) - chaos.acknowledged),
        "dead letters read (read_committed)": sum(letters.values()),
        "lost (dead-letter topics)": len(chaos.bad - set(letters)),
        "duplicated (dead-letter topics)": sum(n - 1 for n in letters.values() if n > 1),
        "unexpected (dead-letter topics)": len(set(letters) - chaos.bad),
    }
    for name, value in figures.items():
        print(f"  {name:<42} {value}")
    print(f"  dead letters per cluster                   {per_cluster}")
    print(
        f"  snapshots (data, quarantine), each minute  {chaos.snapshots} "
        f"(quarantine now {len(quarantine.metadata.snapshots)})"
    )
    return all(
        figures[name] == 0
        for name in figures
        if name.startswith(("lost", "duplicated", "malformed", "not ack", "unexpected"))
    )


def run_states(dagster_home: Path) -> Counter[str]:
    """Every run of the instance by job and status."""
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(dagster_home)) as instance:
        return Counter(f"{r.job_name}: {r.status.value}" for r in instance.get_runs())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=50.0, help="records/s produced")
    parser.add_argument("--bad", type=float, default=0.01, help="share of malformed records")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    # Stopped by Ctrl-C or SIGTERM (also when started in the background, where SIGINT is
    # ignored): the finally clauses below stop MM2, the stack and the dr broker.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"stopped by signal {signum}"))
    workdir = Path(tempfile.mkdtemp(prefix="dev-chaos-"))
    state_dir, port = workdir / "platform", find_free_port()
    print(f"chaos directory (logs, configuration): {workdir}", flush=True)
    with EmbeddedBroker(log_path=workdir / "dr.log", name="dr_cluster") as dr:
        config = write_config(workdir, dr.bootstrap_servers)
        env = {**os.environ, "PLATFORM_CONFIG": str(config)}
        env.pop("PLATFORM_PIPELINES_FILE", None)
        stack, primary = start_stack(state_dir, port, env)
        env |= {
            "KAFKA_BOOTSTRAP_SERVERS": primary,
            "PLATFORM_STATE_DIR": str(state_dir),
            "DAGSTER_HOME": str(state_dir / "dagster_home"),
        }
        os.environ.update({k: env[k] for k in ("KAFKA_BOOTSTRAP_SERVERS", "PLATFORM_STATE_DIR")})
        clusters = {"primary": primary, "dr": dr.bootstrap_servers}
        group = "platform-orders"
        forward = MirrorMaker(
            workdir / "mm2-forward.log", clusters, "primary", "dr", ["orders"], [group, NEW_GROUP]
        )
        copy = forward.remote("orders")
        reverse = MirrorMaker(
            workdir / "mm2-reverse.log",
            clusters,
            "dr",
            "primary",
            [copy],
            [group, NEW_GROUP],
            identity=True,
        )
        chaos = Chaos((primary, "orders"))
        kafka = KafkaResource(
            bootstrap_servers=primary, replicas={"dr": {"bootstrap.servers": dr.bootstrap_servers}}
        )
        iceberg = IcebergCatalogResource(state_dir=str(state_dir))
        operator = Operator(port, state_dir / "dagster_home", env)
        try:
            wait_for(lambda: answers(port), 180, lambda: "the UI's GraphQL API")
            forward.start()
            threads = [
                threading.Thread(
                    target=produce, args=(chaos, args.rate, args.bad, args.seed), daemon=True
                ),
                threading.Thread(
                    target=sample,
                    args=(chaos, iceberg, ("demo.orders", "demo.orders_quarantine")),
                    daemon=True,
                ),
            ]
            for thread in threads:
                thread.start()
            chaos.producing.set()
            ok = timeline(
                chaos, args, operator, workdir, (forward, reverse), clusters, kafka, iceberg
            )
        finally:
            chaos.stop.set()
            forward.stop()
            reverse.stop()
            states = run_states(state_dir / "dagster_home")
            stack.send_signal(signal.SIGINT)
            stack.wait(120)
        print(f"operator actions: {dict(operator.outcomes)}")
        print(f"Dagster runs: {dict(sorted(states.items()))}")
        return 0 if ok else 1


def answers(port: int) -> bool:
    """Whether the UI's webserver answers yet."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
            return True
    except OSError:
        return False


def timeline(
    chaos: Chaos,
    args: argparse.Namespace,
    operator: Operator,
    workdir: Path,
    flows: tuple[MirrorMaker, MirrorMaker],
    clusters: dict[str, str],
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
) -> bool:
    """The module docstring's timeline; True when the oracle holds."""
    forward, reverse = flows
    total_s, started = args.minutes * 60, time.monotonic()

    def at(fraction: float) -> None:
        time.sleep(max(0.0, started + fraction * total_s - time.monotonic()))

    say(f"producing {args.rate:g} records/s, {args.bad:.1%} malformed, for {args.minutes:g} min")
    at(0.10)
    say("reset_offsets job: back 45 s (a re-read range with copied dead letters)")
    back = int(time.time() * 1000) - 45_000
    operator.until_success(
        "reset",
        "reset_offsets",
        "reset_pipeline_offsets",
        {
            "pipeline": PIPELINE,
            "to": "timestamp",
            "timestamp_ms": back,
            "apply": True,
            "reason": "chaos: re-read",
        },
        5,
        5,
    )
    at(0.20)
    say("maintain_tables job, without compaction (see the module docstring)")
    operator.until_success(
        "maintain",
        "maintain_tables",
        "maintain_pipeline_tables",
        {"pipeline": PIPELINE, "compact": False},
        3,
        5,
    )
    at(0.28)
    say(f"migrate_group job to {NEW_GROUP}; the pipelines file follows; reload the location")
    operator.until_success(
        "migrate",
        "migrate_group",
        "migrate_pipeline_group",
        {"pipeline": PIPELINE, "new_group_id": NEW_GROUP, "reason": "chaos: new group"},
        5,
        5,
    )
    use_group(workdir, NEW_GROUP)
    reload = operator.client.reload_repository_location(LOCATION)
    say(f"   code location reloaded: {reload.status.value} {reload.message or ''}")
    at(0.38)
    say("failover to dr: MM2 checkpoints, forward flow stopped, producers on dr, failover job")
    # A planned switchover: producers pause, MM2 copies everything (else the table is ahead of
    # the replica and the failover refuses, naming the records MM2 lacks: --source-lost is for a
    # lost primary), its checkpoints reach the group, MM2 stops, producers move to dr.
    chaos.producing.clear()
    time.sleep(0.5)
    forward.wait_mirrored("orders", 120)
    for partition in range(4):
        forward.wait_checkpoint(NEW_GROUP, "orders", partition)
    forward.stop()
    chaos.target = (clusters["dr"], forward.remote("orders"))
    chaos.producing.set()
    operator.until_success(
        "failover",
        "failover",
        "failover_pipeline",
        {"pipeline": PIPELINE, "to": "dr", "apply": True, "reason": "chaos: drill"},
        10,
        5,
    )
    at(0.55)
    say("failback: reverse flow on, producers on the primary, failover job to primary")
    reverse.start()
    wait_for(
        lambda: (
            sum(
                count_records(
                    clusters["primary"], reverse.remote(forward.remote("orders"))
                ).values()
            )
            > 0
        ),
        120,
        lambda: "MM2's reverse copy",
        reverse.process,
    )
    chaos.producing.clear()
    time.sleep(0.5)
    chaos.target = (clusters["primary"], "orders")
    chaos.producing.set()
    operator.until_success(
        "failback",
        "failover",
        "failover_pipeline",
        {"pipeline": PIPELINE, "to": "primary", "apply": True, "reason": "chaos: back"},
        40,
        5,
    )
    at(0.63)
    say("maintain_tables job, on the failback's route")
    operator.until_success(
        "maintain",
        "maintain_tables",
        "maintain_pipeline_tables",
        {"pipeline": PIPELINE, "compact": False},  # see the module docstring
        3,
        5,
    )
    at(0.70)
    say("complete-failback: reverse copy drained, reverse flow stopped, failover job complete")
    reverse.wait_mirrored(reverse.topics[0], 300)
    time.sleep(15)  # the stream reads what the reverse flow copied last
    reverse.stop()
    operator.until_success(
        "complete",
        "failover",
        "failover_pipeline",
        {"pipeline": PIPELINE, "complete": True, "apply": True, "reason": "chaos: drained"},
        24,
        5,
    )
    at(0.80)
    say("platform reset from the CLI: back 30 s, holding the stream's lane")
    back = int(time.time() * 1000) - 30_000
    operator.cli(
        "CLI reset",
        [
            "reset",
            PIPELINE,
            "--to",
            f"timestamp:{back}",
            "--apply",
            "--reason",
            "chaos: CLI re-read",
        ],
        10,
        3,
    )
    at(0.90)
    say("maintain_tables job: expiry and orphans")
    operator.until_success(
        "maintain",
        "maintain_tables",
        "maintain_pipeline_tables",
        {"pipeline": PIPELINE, "compact": False},
        3,
        5,
    )
    at(1.0)
    chaos.producing.clear()
    chaos.stop.set()
    say("producers stopped; draining")
    seconds = drain(kafka, iceberg, workdir, 600)
    time.sleep(20)  # the last iteration's dead-letter copy and mirror
    say(f"lag 0 after {seconds:.0f} s")
    return verdict(chaos, iceberg, clusters)


if __name__ == "__main__":
    raise SystemExit(main())
