"""A disaster-recovery drill on the real stack: the primary dies while ingestion runs.

    .venv/bin/python scripts/dr_drill.py [--rate 200] [--phase-seconds 40] [--partitions 8]
        [--forward-resumes] [--naming identity] [--via dagster]

Run by hand, not in CI. Two embedded brokers (``primary`` and ``dr``) and a throw-away SQLite
catalog. Real MirrorMaker 2 in dedicated mode (``tests/support/mirror_maker.py``: Apache Kafka's
``connect-mirror``, one process per flow, checkpoints every second) mirrors ``orders`` to dr's
``primary.orders`` (``--naming identity``: to dr's ``orders``, the recommended setup of
docs/disaster-recovery.md, with the reverse flow under default naming, dr's ``orders`` to the
primary's ``dr.orders``; rows record the cluster they were read on, ``_kafka_cluster``). The shipped
``orders`` pipeline is given replica ``dr`` and data as teams have it: 0.5 % malformed JSON, and
``created_at`` over 30 days, so each commit writes many table partitions. Runs go back to back
through the route, as the Dagster asset runs them (``platform_assets.route.active_route`` ->
``run_pipeline``). The operator uses the ``platform failover`` commands as docs/disaster-recovery.md
gives them, racing the runs:

1. steady ingestion from the primary;
2. the disaster: MM2 falls behind (its process is stopped: the RPO tail; the table is ahead of
   MM2's copy), producers
   move to dr's copy (``primary.orders``, or ``orders`` under identity naming), the primary is
   SIGSTOPped, the operator fails over to dr with ``--source-lost``;
3. steady ingestion from dr;
4. the primary is back (SIGCONT): the forward flow stays stopped (with ``--forward-resumes``
   it first copies for 10 s: its late copies of the records the table ingested without a
   copy, which runs skip, R54), a reverse flow (identity naming, or default under
   ``--naming identity``) copies dr back, producers return to ``orders``, the operator fails
   back (retrying every 5 s while the plan says to wait for MM2);
5. the reverse copy drains, the reverse flow is stopped, the operator completes the failback
   (``platform complete-failback``) while producers keep writing;
6. producers stop, the pipeline drains, and the oracle reads plain scans of the data and
   quarantine tables by each record's own key: every acknowledged record once.

With ``--via dagster`` it takes the user's path instead (``scripts/dr_dagster.py``): each
ingestion run is a Dagster run of the pipeline's ingestion job from the code location's
Definitions (loaded from the drill's ``$PLATFORM_CONFIG``: its brokers and catalog), and each
operator action a run of the ``failover`` job (``to``, ``source_lost``, ``reason``; ``complete``),
all on one temp-dir DagsterInstance, so the job is refused while an ingestion run is active, as
in a deployment; runs are counted by outcome (failed: the error class of the run's failure
event), and the first failed run per job and class is printed with its traceback.

It prints, per operator action, its attempts and wall time; the seconds from the switch to the
first commit on dr; the runs' outcomes; MM2's start times and resident sets; and the oracle.
The exit status is 1 when a record was lost or duplicated. MM2's logs stay in the drill's
temporary directory (printed first).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import os
import random
import signal
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

import orjson  # noqa: E402
import yaml  # noqa: E402
from dr_dagster import DagsterPath, Refused, job_config  # noqa: E402

from ingestion.pipeline.run import run_pipeline  # noqa: E402
from ingestion.spec.pipeline import PipelineSpec, load_pipeline_specs, parse_pipeline_spec  # noqa: E402
from ingestion.table.offsets import (  # noqa: E402
    CLUSTER_ID,
    RESET_BY,
    snapshot_properties,
)
from ingestion.table.offsets import count_skipped as count_commit_skipped  # noqa: E402
from ingestion.table.route import SWITCH_SNAPSHOT, active_switch  # noqa: E402
from platform_assets.cli.main import main as platform  # noqa: E402
from platform_assets.demo import encode_event, make_order_event  # noqa: E402
from platform_assets.route import active_route  # noqa: E402
from platform_assets.state import read_pipeline_state  # noqa: E402
from resources.embedded import EmbeddedBroker, cluster_id_for  # noqa: E402
from resources.iceberg import IcebergCatalogResource  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402
from tests.support.mirror_maker import MirrorMaker, count_records, wait_for  # noqa: E402

PIPELINES = ROOT / "platform_assets" / "pipelines.yaml"
CLUSTERS = {cluster_id_for("primary_cluster"): "primary", cluster_id_for("dr_cluster"): "dr"}


@dataclass
class Drill:
    """State shared by the producer, the mirror, the ingestion loop and the operator."""

    spec: PipelineSpec
    kafka: KafkaResource
    iceberg: IcebergCatalogResource
    target: tuple[str, str]  # (bootstrap servers, topic) producers write to now
    acknowledged: set[str] = field(default_factory=set)
    runs: Counter[str] = field(default_factory=Counter)  # runs' outcomes
    mm2: list[str] = field(default_factory=list)  # each MM2 start: seconds and resident set
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    producing: threading.Event = field(default_factory=threading.Event)
    dagster: DagsterPath | None = None  # --via dagster: runs and operator actions are Dagster runs


def produce(drill: Drill, rate: int) -> None:
    """Order events spread over 30 days, 0.5 % malformed, at ``rate``/s to ``drill.target``."""
    from confluent_kafka import Producer

    rng, sequence, now = random.Random(3), 0, dt.datetime.now(tz=dt.UTC)
    producers: dict[str, Producer] = {}

    def acknowledge(error: Any, message: Any) -> None:
        if error is None:
            with drill.lock:
                drill.acknowledged.add(message.key().decode())

    while not drill.stop.is_set():
        if not drill.producing.wait(0.2):
            continue
        bootstrap, topic = drill.target
        producer = producers.setdefault(bootstrap, Producer({"bootstrap.servers": bootstrap}))
        started = time.monotonic()
        for _ in range(max(1, rate // 10)):
            key = f"ord-{sequence:09d}"
            # created_at over 30 days: each commit writes many day partitions
            event = make_order_event(rng, sequence, now - dt.timedelta(days=sequence % 30))
            value = b"{not json" if rng.random() < 0.005 else encode_event(event)
            producer.produce(topic, key=key.encode(), value=value, on_delivery=acknowledge)
            sequence += 1
        producer.flush(30)  # acknowledged batches only, before the target moves
        time.sleep(max(0.0, 0.1 - (time.monotonic() - started)))


def start_mm2(drill: Drill, mm2: MirrorMaker) -> MirrorMaker:
    """Start an MM2 flow and note its start time and resident set."""
    mm2.start()
    flow = f"{mm2.source_alias} -> {mm2.target_alias}"
    drill.mm2.append(
        f"{flow}: started in {mm2.started_s:.1f} s, RSS {(mm2.rss_kb() or 0) // 1024} MB"
    )
    return mm2


def note_rss(drill: Drill, mm2: MirrorMaker) -> None:
    """Note the flow's resident set before it stops."""
    flow = f"{mm2.source_alias} -> {mm2.target_alias}"
    drill.mm2.append(f"{flow}: RSS {(mm2.rss_kb() or 0) // 1024} MB before its stop")


def ingest(drill: Drill) -> None:
    """Runs back to back through the route, as the Dagster ingestion asset runs them (with
    ``--via dagster``: Dagster runs of its job)."""
    catalog = drill.iceberg.load_catalog()
    while not drill.stop.wait(0.5):
        if drill.dagster is not None:
            outcome = ingest_by_dagster(drill.dagster, catalog, drill.spec.table)
            with drill.lock:
                drill.runs[outcome] += 1
            continue
        try:
            route = active_route(drill.spec, drill.kafka, drill.iceberg)
            source = route.kafka
            report = run_pipeline(
                route.spec,
                source.client_config(),
                catalog,
                None,
                source.get_cluster_id(),
                cluster_config=lambda name: drill.kafka.for_cluster(name).client_config(),
                cluster=route.cluster,
            )
            outcome = f"committed on {route.cluster}" if report.committed else "empty"
        except Exception as exc:  # the primary is stopped; a switch won the race
            outcome = type(exc).__name__
        with drill.lock:
            drill.runs[outcome] += 1


def ingest_by_dagster(dagster: DagsterPath, catalog: Any, table: str) -> str:
    """One Dagster run of the ingestion job; its outcome, with the cluster it committed on."""
    try:
        outcome, snapshot_id = dagster.ingest()
    except Exception as exc:  # not a failed run: the run could not be executed at all
        return f"dagster run not executed: {type(exc).__name__}: {exc}"
    if snapshot_id is None:
        return outcome
    snapshot = catalog.load_table(table).snapshot_by_id(snapshot_id)
    cluster = snapshot_properties(snapshot).get(CLUSTER_ID, "?") if snapshot else "?"
    return f"{outcome} on {CLUSTERS.get(cluster, cluster)}"


def operate(drill: Drill, args: list[str], attempts: int, pause_s: float) -> tuple[int, float, str]:
    """``platform failover ...`` (``--via dagster``: a run of the ``failover`` job with the same
    settings) until it commits, ``pause_s`` apart (a refusal says why, e.g. "wait for
    MirrorMaker 2"): (attempts, seconds, its output)."""
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        out, outcome = io.StringIO(), "error"
        try:
            if drill.dagster is not None:
                out.write(drill.dagster.operate(job_config(args)))
                outcome = "committed"
            else:
                with contextlib.redirect_stdout(out):
                    platform(args)
            return attempt, time.monotonic() - started, out.getvalue()
        except (SystemExit, Refused) as exc:  # refused: print why, plan again
            outcome = "refused"
            print(f"    attempt {attempt}: {exc}", flush=True)
            time.sleep(pause_s)
        finally:
            if drill.dagster is not None:
                with drill.lock:
                    drill.runs[f"failover job {args[0]}: {outcome}"] += 1
    raise RuntimeError(f"platform {' '.join(args)} did not commit in {attempts} attempts")


def drain(
    drill: Drill, skip: str | None = None, flow: MirrorMaker | None = None, timeout_s: float = 600
) -> None:
    """Until ``flow`` (an MM2 flow whose source no producer writes to now) has copied its topic
    and the route's lag (but on topic ``skip``, where producers still write) is 0."""
    deadline = time.monotonic() + timeout_s
    if flow is not None:
        flow.wait_mirrored(flow.topics[0], timeout_s)
    while time.monotonic() < deadline:
        time.sleep(2)
        lag = read_pipeline_state(drill.spec, drill.kafka, drill.iceberg).lag()
        if sum(n for (topic, _), n in lag.items() if topic != skip) == 0:
            return


def first_commit_on(drill: Drill, cluster_id: str, timeout_s: float = 300) -> float:
    """Seconds until the table's newest run commit was read on ``cluster_id``."""
    catalog, started = drill.iceberg.load_catalog(), time.monotonic()
    while time.monotonic() - started < timeout_s:
        snapshot = catalog.load_table(drill.spec.table).current_snapshot()
        properties = snapshot_properties(snapshot) if snapshot else {}
        if properties.get(CLUSTER_ID) == cluster_id and RESET_BY not in properties:
            return time.monotonic() - started
        time.sleep(0.2)
    return float("nan")


def verdict(drill: Drill) -> bool:
    """Every acknowledged record once, from plain scans keyed by the record's own key."""
    catalog = drill.iceberg.load_catalog()
    keys = catalog.load_table(drill.spec.table).scan(selected_fields=("_kafka_key",)).to_arrow()
    found = Counter(keys.column("_kafka_key").to_pylist())
    quarantine = catalog.load_table(drill.spec.quarantine_table).scan(
        selected_fields=("_kafka_key",)
    )
    bad = Counter(k.decode() for k in quarantine.to_arrow().column("_kafka_key").to_pylist())
    every = found + bad
    lost = drill.acknowledged - set(every)
    twice = {k: n for k, n in every.items() if n > 1}
    print(
        f"  acknowledged {len(drill.acknowledged)}; table {sum(found.values())} rows, "
        f"quarantine {sum(bad.values())}; lost {len(lost)}, duplicated {len(twice)}, "
        f"not acknowledged but ingested {len(set(every) - drill.acknowledged)}"
    )
    if lost or twice:
        print(f"  lost e.g. {sorted(lost)[:5]}; duplicated e.g. {sorted(twice)[:5]}")
    return not lost and not twice


def write_config(
    workdir: Path, primary: str, dr: str, partitions: int, naming: str
) -> PipelineSpec:
    (orders,) = load_pipeline_specs(PIPELINES)
    raw = orders.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw.pop("freshness_target_seconds", None)  # runs back to back below, no stream
    raw["in_process_max_records"] = 10_000_000
    raw["replicas"] = [
        {"name": "dr", "source_alias": "primary", "target_alias": "dr"}
        | (
            {"replication_policy": "identity", "failback_replication_policy": "default"}
            if naming == "identity"
            else {}
        )
    ]
    spec = parse_pipeline_spec(raw)
    (workdir / "pipelines.yaml").write_text(yaml.safe_dump({"pipelines": [raw]}))
    config = {
        "kafka": {"bootstrap_servers": primary},
        "catalog": {"state_dir": str(workdir / "state")},
        "replicas": {"dr": {"bootstrap_servers": dr}},
        "pipelines_file": str(workdir / "pipelines.yaml"),
    }
    (workdir / "platform.yaml").write_text(yaml.safe_dump(config))
    os.environ["PLATFORM_CONFIG"] = str(workdir / "platform.yaml")
    os.environ.pop("PLATFORM_PIPELINES_FILE", None)
    return spec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=200, help="records/s produced")
    parser.add_argument("--phase-seconds", type=float, default=40.0)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument(
        "--forward-resumes",
        action="store_true",
        help="when the primary is back, MM2's forward flow resumes first (its late copies of "
        "the records the table ingested without a copy: R54), then stops before the failback",
    )
    parser.add_argument(
        "--via",
        choices=("direct", "dagster"),
        default="direct",
        help="direct: runs call the ingestion asset's code, the operator uses the platform CLI; "
        "dagster: Dagster runs of the code location's ingestion and failover jobs",
    )
    parser.add_argument(
        "--naming",
        choices=("default", "identity"),
        default="default",
        help="MM2's replication policy of the forward flow (the reverse flow takes the other)",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="dr-drill-"))
    with (
        EmbeddedBroker(log_path=workdir / "primary.log", name="primary_cluster") as p,
        EmbeddedBroker(log_path=workdir / "dr.log", name="dr_cluster") as d,
    ):
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": p.bootstrap_servers})
        for future in admin.create_topics([NewTopic("orders", args.partitions, 1)]).values():
            future.result(15)
        spec = write_config(
            workdir, p.bootstrap_servers, d.bootstrap_servers, args.partitions, args.naming
        )
        kafka = KafkaResource(
            bootstrap_servers=p.bootstrap_servers,
            replicas={"dr": {"bootstrap.servers": d.bootstrap_servers}},
        )
        iceberg = IcebergCatalogResource(state_dir=str(workdir / "state"))
        drill = Drill(spec, kafka, iceberg, (p.bootstrap_servers, "orders"))
        if args.via == "dagster":  # the code location loads from the drill's PLATFORM_CONFIG
            drill.dagster = DagsterPath.open(workdir / "dagster_home", spec)
        group = spec.consumer_group_id
        clusters = {"primary": p.bootstrap_servers, "dr": d.bootstrap_servers}
        forward = MirrorMaker(
            workdir / "mm2-forward.log",
            clusters,
            "primary",
            "dr",
            ["orders"],
            [group],
            identity=args.naming == "identity",
        )
        copy = forward.remote("orders")  # dr's copy: primary.orders, or orders (identity)
        reverse = MirrorMaker(
            workdir / "mm2-reverse.log",
            clusters,
            "dr",
            "primary",
            [copy],
            [group],
            identity=not forward.identity,
        )
        print(f"drill directory (logs, MM2's properties): {workdir}", flush=True)
        start_mm2(drill, forward)
        threads = [
            threading.Thread(target=produce, args=(drill, args.rate), daemon=True),
            threading.Thread(target=ingest, args=(drill,), daemon=True),
        ]
        for thread in threads:
            thread.start()
        try:
            return run_drill(drill, args, p, d, (forward, reverse), threads)
        finally:
            drill.stop.set()
            os.kill(p.pid or 0, signal.SIGCONT)
            forward.stop()
            reverse.stop()


def run_drill(
    drill: Drill,
    args: argparse.Namespace,
    p: EmbeddedBroker,
    d: EmbeddedBroker,
    flows: tuple[MirrorMaker, MirrorMaker],
    threads: list[threading.Thread],
) -> int:
    """The drill's timeline (module docstring); 0 when every record landed once."""
    spec, iceberg = drill.spec, drill.iceberg
    forward, reverse = flows
    group = spec.consumer_group_id
    drill.producing.set()
    phase = args.phase_seconds
    # Through Dagster the failover job is also refused while an ingestion run is active
    # (they run back to back here): the operator runs it again, more often.
    patience = 6 if drill.dagster is not None else 1

    def say(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    say(
        f"1. steady on the primary for {phase:.0f} s ({args.rate} records/s, "
        f"{args.partitions} partitions, 0.5 % malformed, 30 days of created_at)"
    )
    time.sleep(phase)
    for partition in range(args.partitions):  # what the replica check asks before a failover
        forward.wait_checkpoint(spec.consumer_group_id, "orders", partition)
    note_rss(drill, forward)
    forward.stop()  # MM2 falls behind: what is produced now is the RPO tail
    time.sleep(3)
    drill.producing.clear()
    time.sleep(0.5)
    copy = forward.remote("orders")
    drill.target = (d.bootstrap_servers, copy)
    drill.producing.set()
    os.kill(p.pid or 0, signal.SIGSTOP)
    say("2. disaster: primary SIGSTOPped; producers on dr; platform failover orders --to dr")
    tries, seconds, _ = operate(
        drill,
        ["failover", "orders", "--to", "dr", "--source-lost", "--reason", "drill", "--apply"],
        5 * patience,
        1.0,
    )
    to_dr = first_commit_on(drill, cluster_id_for("dr_cluster"))
    say(
        f"   switched after {tries} attempt(s), {seconds:.1f} s; first commit on dr "
        f"{to_dr:.1f} s later"
    )
    time.sleep(phase)
    os.kill(p.pid or 0, signal.SIGCONT)
    if args.forward_resumes:
        say("3b. primary back; MM2's forward flow resumes (late copies of the uncopied records)")
        start_mm2(drill, forward)  # resumes from its committed source offsets
        time.sleep(10)  # it copies the tail after what producers wrote on dr meanwhile
        note_rss(drill, forward)
        forward.stop()
        time.sleep(10)  # the route reads them
        say(f"   late copies skipped so far: {count_skipped(drill)}")
    start_mm2(drill, reverse)
    wait_for(  # the reverse flow copies (it created its topic) and checkpoints
        lambda: sum(count_records(p.bootstrap_servers, reverse.remote(copy)).values()) > 0,
        120,
        lambda: f"MM2's reverse copy {reverse.remote(copy)}",
        reverse,
    )
    drill.producing.clear()
    time.sleep(0.5)
    drill.target = (p.bootstrap_servers, "orders")
    drill.producing.set()
    say("4. primary back, reverse flow on; producers on the primary; failback")
    back = ["failover", "orders", "--to", "primary", "--reason", "back", "--apply"]
    tries, seconds, _ = operate(drill, back, 60 * patience, 5.0)
    catalog = iceberg.load_catalog()
    table = catalog.load_table(spec.table)
    route = active_switch(table, group) or {}
    switch = table.metadata.snapshot_by_id(int(route.get(SWITCH_SNAPSHOT, -1)))
    properties = snapshot_properties(switch) if switch else {}
    plans = orjson.loads(properties.get("kafka.failover-origin", "[]"))
    tail = sum(int(plan["tail"]) for plan in plans)
    say(
        f"   failed back after {tries} attempt(s), {seconds:.1f} s; the origin resumes with "
        f"{tail} record(s) (the unreplicated tail, then what producers wrote since they "
        f"returned) over {len(plans)} partition(s)"
    )
    time.sleep(phase)
    say("5. the reverse copy drained: MM2's reverse flow stopped; platform complete-failback")
    drain(drill, skip="orders", flow=reverse)
    note_rss(drill, reverse)
    reverse.stop()
    end = ["complete-failback", "orders", "--reason", "reverse copy drained", "--apply"]
    tries, seconds, _ = operate(drill, end, 12 * patience, 5.0)
    say(f"   completed after {tries} attempt(s), {seconds:.1f} s; producers keep writing")
    time.sleep(10)
    drill.producing.clear()
    time.sleep(0.5)
    say("6. producers stopped; draining")
    drain(drill)
    drill.stop.set()
    for thread in threads:
        thread.join()
    print(f"runs: {dict(drill.runs)}")
    print(f"MirrorMaker 2: {drill.mm2}")
    for failure in drill.dagster.describe_failures() if drill.dagster else []:
        print(f"failed runs: {failure}")
    print(f"late copies skipped (kafka.late-copies over the commits): {count_skipped(drill)}")
    return 0 if verdict(drill) else 1


def count_skipped(drill: Drill) -> int:
    """MM2's late copies the table's commits skipped (R54)."""
    table = drill.iceberg.load_catalog().load_table(drill.spec.table)
    return sum(count_commit_skipped(snapshot_properties(s)) for s in table.snapshots())


if __name__ == "__main__":
    sys.exit(main())
