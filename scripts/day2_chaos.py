"""Day-2 chaos on the real stack: operators act at random moments while ingestion runs.

    .venv/bin/python scripts/day2_chaos.py [--minutes 10] [--rate 200] [--spark] [--seed 7]

Run by hand, not in CI. It starts an embedded broker and a throw-away SQLite catalog, produces
JSON events (about 0.5 % malformed, so the quarantine table is exercised) at ``--rate`` records/s
to a 4-partition topic, runs ingestion back to back (in the driver, or on local Spark with
``--spark``), and, every 15-45 s, one operator action chosen at random, racing the runs:
an offset reset backwards (to a timestamp a little in the past) or forwards (to the latest
offsets: a deliberate skip), a group migration (the spec then follows the new group), or a
maintenance pass (compaction, expiry, orphan removal). At the end it stops producing, drains
the topic, and prints the oracle's verdict from a plain scan of the data and quarantine tables
(no lineage filter): every acknowledged record once, in the table or, if malformed, in the
quarantine table, except the ranges a forward reset deliberately skipped; nothing twice; and
whether any run stayed blocked (failed for longer than ``--blocked-after`` seconds in a row).
The pipeline copies its dead letters to ``chaos-dlq`` (created by the first copy); a plain
``read_committed`` consumer reads it to the end, and the oracle checks each quarantine row's
letter is there exactly once (by source coordinates: a record a backward reset re-reads keeps
the letter it had, as the quarantine table keeps one row), and prints the
quarantine table's snapshot count (maintenance keeps it bounded).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from ingestion.exceptions import IngestionError  # noqa: E402
from ingestion.health.checks import check_group_consistency  # noqa: E402
from ingestion.health.state import PipelineState, read_state  # noqa: E402
from ingestion.ops.maintenance import maintain_pipeline  # noqa: E402
from ingestion.ops.reset import apply_reset, migrate_group, plan_reset  # noqa: E402
from ingestion.pipeline.run import run_pipeline  # noqa: E402
from ingestion.spec.pipeline import PipelineSpec, StartingPosition, parse_pipeline_spec  # noqa: E402
from resources.embedded import EmbeddedBroker  # noqa: E402
from resources.iceberg import IcebergCatalogResource  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402

TOPIC, PARTITIONS, DEAD_LETTERS = "chaos", 4, "chaos-dlq"
Coordinates = tuple[str, int, int]


@dataclass
class Shared:
    """State shared by the producer, the ingestion loop and the operator."""

    spec: PipelineSpec
    bootstrap: str
    good: set[Coordinates] = field(default_factory=set)
    bad: set[Coordinates] = field(default_factory=set)
    skipped: set[tuple[str, int, int, int]] = field(default_factory=set)  # topic, p, from, to
    actions: Counter[str] = field(default_factory=Counter)
    runs: Counter[str] = field(default_factory=Counter)
    failing_since: float | None = None
    longest_failing_s: float = 0.0
    last_error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)


def make_spec(group: str) -> PipelineSpec:
    return parse_pipeline_spec(
        {
            "name": "chaos",
            "topic": TOPIC,
            "table": "chaos.events",
            "consumer_group_id": group,
            "value_format": "json",
            "key_format": "string",
            "schema": [
                {"name": "id", "type": "long", "required": True},
                {"name": "ts", "type": "timestamptz"},
                {"name": "amount", "type": "double"},
            ],
            "partition_by": [{"source": "ts", "transform": "day"}],
            "errors_tolerance": "all",
            "dead_letter_topic": DEAD_LETTERS,
            "max_records_per_task": 2_000,
            "max_records_per_run": 20_000,
            "in_process_max_records": 10_000_000,
        }
    )


def produce(kafka: KafkaResource, shared: Shared, rate: int, rng: random.Random) -> None:
    """Produce at ``rate``/s until stopped; then one record per partition alone (exact ends)."""
    producer = kafka.get_producer(**{"linger.ms": 20})

    def on_delivery(error: Any, message: Any, is_bad: bool) -> None:
        if error is not None:
            return  # not acknowledged: not expected anywhere
        coordinates = (TOPIC, int(message.partition()), int(message.offset()))
        with shared.lock:
            (shared.bad if is_bad else shared.good).add(coordinates)

    def send(i: int, partition: int | None = None) -> None:
        is_bad = rng.random() < 0.005
        value = (
            b"{not json"
            if is_bad
            else orjson.dumps(
                {"id": i, "ts": f"2026-11-{1 + i % 28:02d}T10:00:00Z", "amount": i / 3}
            )
        )
        callback = lambda e, m, b=is_bad: on_delivery(e, m, b)  # noqa: E731
        if partition is None:
            producer.produce(TOPIC, key=str(i).encode(), value=value, on_delivery=callback)
        else:
            producer.produce(
                TOPIC, key=str(i).encode(), value=value, partition=partition, on_delivery=callback
            )

    i = 0
    while not shared.stop.is_set():
        started = time.monotonic()
        for _ in range(max(1, rate // 10)):
            send(i)
            i += 1
        producer.poll(0)
        time.sleep(max(0.0, 0.1 - (time.monotonic() - started)))
    producer.flush(30)
    for partition in range(PARTITIONS):  # each partition's last record alone (harmless)
        send(i, partition)
        i += 1
        producer.flush(30)


def read_pipeline_state(kafka: KafkaResource, catalog: Any, spec: PipelineSpec) -> PipelineState:
    table = catalog.load_table(spec.table) if catalog.table_exists(spec.table) else None
    consumer = kafka.get_consumer()
    try:
        return read_state(spec, table, kafka.get_admin_client(), consumer)
    finally:
        consumer.close()


def ingest_once(kafka: KafkaResource, catalog: Any, spark: Any, shared: Shared) -> None:
    """One run as the Dagster asset does it: the blocking group check first, then the run."""
    spec = shared.spec
    try:
        finding = check_group_consistency(read_pipeline_state(kafka, catalog, spec))
        if finding.blocks:
            raise IngestionError(f"pipeline {spec.name!r} blocked: {finding.message}")
        report = run_pipeline(spec, kafka.client_config(), catalog, spark, kafka.get_cluster_id())
    except IngestionError as exc:
        now = time.monotonic()
        with shared.lock:
            shared.runs[type(exc).__name__] += 1
            shared.failing_since = shared.failing_since or now
            shared.longest_failing_s = max(shared.longest_failing_s, now - shared.failing_since)
            shared.last_error = str(exc)
        return
    with shared.lock:
        shared.runs["committed" if report.committed else "empty"] += 1
        shared.failing_since = None


def ingest(
    kafka: KafkaResource, catalog: Any, spark: Any, shared: Shared, interval_s: float
) -> None:
    """Runs back to back, ``interval_s`` apart (the lag sensor ticks every 15 s in Dagster)."""
    while not shared.stop.wait(interval_s):
        ingest_once(kafka, catalog, spark, shared)


def act(kafka: KafkaResource, catalog: Any, shared: Shared, rng: random.Random) -> str:
    """One operator action, chosen at random, racing the ingestion loop."""
    spec = shared.spec
    action = rng.choice(["reset-back", "reset-forward", "migrate", "maintain"])
    if not catalog.table_exists(spec.table):
        return "skipped (no table yet)"
    if action in ("reset-back", "reset-forward"):
        position = (
            StartingPosition(mode="timestamp", timestamp_ms=int((time.time() - 20) * 1000))
            if action == "reset-back"
            else StartingPosition(mode="latest")
        )
        consumer = kafka.get_consumer()
        try:
            reset = plan_reset(
                spec, catalog.load_table(spec.table), kafka.get_admin_client(), consumer, position
            )
        finally:
            consumer.close()
        outcome = apply_reset(
            catalog,
            spec,
            reset,
            kafka.get_cluster_id(),
            "chaos",
            f"chaos {action}",
            admin=kafka.get_admin_client(),
            kafka_config=kafka.client_config(),
        )
        with shared.lock:  # a reset "back" to a timestamp may still move a lagging partition on
            for (topic, partition), (before, after) in reset.changes.items():
                if before is not None and after > before:
                    shared.skipped.add((topic, partition, before, after))
        return f"{action} committed in snapshot {outcome.snapshot_id}"
    if action == "migrate":
        new_group = f"chaos-{int(time.time() * 1000) % 10**8}"
        migration = migrate_group(
            catalog,
            spec,
            new_group,
            kafka.get_admin_client(),
            "chaos",
            "chaos migration",
            kafka_config=kafka.client_config(),
        )
        with shared.lock:
            shared.spec = make_spec(new_group)
        return f"migrated to {new_group!r} in snapshot {migration.snapshot_id}"
    report = maintain_pipeline(catalog, spec, 60.0, 600.0)
    return (
        f"maintain: compacted {report.files_compacted} -> {report.files_written}, expired "
        f"{report.expired_snapshots}, orphans {len(report.orphans_removed)}"
    )


def operate(kafka: KafkaResource, catalog: Any, shared: Shared, rng: random.Random) -> None:
    while not shared.stop.wait(rng.uniform(15, 45)):
        try:
            outcome = act(kafka, catalog, shared, rng)
            label = outcome.split()[0]
        except IngestionError as exc:  # a race lost to a run: it must name the other
            outcome, label = f"aborted: {exc}", f"aborted {type(exc).__name__}"
        except Exception:  # anything else is a defect: keep going, report it
            outcome, label = f"error: {traceback.format_exc(limit=3)}", "error"
        with shared.lock:
            shared.actions[label] += 1
        print(f"[{time.strftime('%H:%M:%S')}] operator: {outcome}", flush=True)


def verdict(catalog: Any, shared: Shared) -> bool:
    """The oracle, from plain scans (no filter, no lineage): print it, return True if clean."""
    spec = shared.spec
    rows = catalog.load_table(spec.table).scan(
        selected_fields=("_kafka_topic", "_kafka_partition", "_kafka_offset")
    )
    landed = Counter(zip(*(rows.to_arrow().column(i).to_pylist() for i in range(3)), strict=True))
    quarantine_rows = Counter[Coordinates]()
    if catalog.table_exists(spec.quarantine_table):
        scan = catalog.load_table(spec.quarantine_table).scan(
            selected_fields=("_kafka_topic", "_kafka_partition", "_kafka_offset")
        )
        columns = scan.to_arrow()
        quarantine_rows = Counter(
            zip(*(columns.column(i).to_pylist() for i in range(3)), strict=True)
        )

    def skipped(c: Coordinates) -> bool:
        return any(t == c[0] and p == c[1] and a <= c[2] < b for t, p, a, b in shared.skipped)

    # A skipped range may be read again after all (a later reset back into it): skipped records
    # are allowed to be missing, never to be twice.
    expected_good = {c for c in shared.good if not skipped(c)}
    expected_bad = {c for c in shared.bad if not skipped(c)}
    figures = {
        "acknowledged": len(shared.good) + len(shared.bad),
        "deliberately skipped (forward resets)": sum(
            1 for c in shared.good | shared.bad if skipped(c)
        ),
        "table rows": sum(landed.values()),
        "quarantine rows": sum(quarantine_rows.values()),
        "lost (table)": len(expected_good - set(landed)),
        "lost (quarantine)": len(expected_bad - set(quarantine_rows)),
        "duplicated (table)": sum(n - 1 for n in landed.values() if n > 1),
        "duplicated (quarantine)": sum(n - 1 for n in quarantine_rows.values() if n > 1),
        "unexpected (table)": len(set(landed) - shared.good),
        "unexpected (quarantine)": len(set(quarantine_rows) - shared.bad),
    }
    quarantine = catalog.load_table(spec.quarantine_table)
    figures.update(dead_letter_figures(quarantine, shared.bootstrap))
    figures["quarantine snapshots (info)"] = len(quarantine.metadata.snapshots)
    for name, value in figures.items():
        print(f"  {name:<40} {value}")
    return all(
        figures[name] == 0
        for name in figures
        if name.startswith(("lost", "duplicated", "unexpected"))
    )


def header_text(headers: Any) -> dict[str, str]:
    """A record's headers as text."""
    return {h[0]: h[1].decode() if isinstance(h[1], bytes) else str(h[1]) for h in headers}


def dead_letter_figures(
    quarantine: Any, bootstrap: str, topic: str = DEAD_LETTERS
) -> dict[str, int]:
    """The dead-letter topic read to its end by a plain read_committed consumer, against the
    quarantine table: each quarantined source record's letter exactly once (by the source
    coordinates its headers name; a record a backward reset re-read keeps the letter of its
    first commit, docs/reliability.md R33)."""
    from confluent_kafka import Consumer, TopicPartition

    names = ("_kafka_topic", "_kafka_partition", "_kafka_offset")
    rows = quarantine.scan(selected_fields=names).to_arrow()  # in the table's column order
    expected = set(zip(*(rows.column(name).to_pylist() for name in names), strict=True))
    reader = {"bootstrap.servers": bootstrap, "group.id": "chaos-dlq-reader"}
    consumer = Consumer({**reader, "isolation.level": "read_committed"})
    letters = Counter[tuple[str, int, int]]()
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        while batch := consumer.consume(1000, timeout=5):
            for message in batch:
                if message.error() is None:
                    h = header_text(message.headers() or [])
                    letters[
                        (
                            h["__connect.errors.topic"],
                            int(h["__connect.errors.partition"]),
                            int(h["__connect.errors.offset"]),
                        )
                    ] += 1
    finally:
        consumer.close()
    return {
        "dead letters read (read_committed)": sum(letters.values()),
        "lost (dead-letter topic)": len(expected - set(letters)),
        "duplicated (dead-letter topic)": sum(n - 1 for n in letters.values() if n > 1),
        # A letter delivered, its record rewound by a reset back, then skipped by one forward.
        "letters of records no longer quarantined (info)": len(set(letters) - expected),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--spark", action="store_true", help="prepare files on local[2] Spark")
    parser.add_argument("--blocked-after", type=float, default=120.0)
    parser.add_argument("--run-interval", type=float, default=3.0, help="seconds between runs")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="day2-chaos-"))
    with EmbeddedBroker(log_path=workdir / "kafka.log") as broker:
        kafka = KafkaResource(bootstrap_servers=broker.bootstrap_servers)
        from confluent_kafka.admin import NewTopic

        admin = kafka.get_admin_client()  # kept referenced until the futures resolve
        for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
            future.result(15)
        catalog = IcebergCatalogResource(state_dir=str(workdir)).load_catalog()
        spark = None
        if args.spark:
            from resources.spark import SparkResource

            spark = SparkResource(master="local[2]").spark_session
        shared = Shared(spec=make_spec("chaos-0"), bootstrap=broker.bootstrap_servers)
        threads = [
            threading.Thread(target=produce, args=(kafka, shared, args.rate, random.Random(1))),
            threading.Thread(
                target=ingest, args=(kafka, catalog, spark, shared, args.run_interval)
            ),
            threading.Thread(target=operate, args=(kafka, catalog, shared, rng)),
        ]
        for thread in threads:
            thread.start()
        shared.stop.wait(args.minutes * 60)
        shared.stop.set()
        for thread in threads:
            thread.join()
        print(f"[{time.strftime('%H:%M:%S')}] stopped producing; draining", flush=True)
        shared.stop.clear()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            ingest_once(kafka, catalog, spark, shared)
            state = read_pipeline_state(kafka, catalog, shared.spec)
            if sum(state.lag().values()) == 0 and shared.failing_since is None:
                break
        print(f"runs: {dict(shared.runs)}")
        print(f"operator actions: {dict(shared.actions)}")
        blocked = shared.longest_failing_s > args.blocked_after or shared.failing_since is not None
        print(
            f"longest run of consecutive failed runs: {shared.longest_failing_s:.0f} s; "
            f"blocked: {'YES' if blocked else 'no'}"
            + (f" (last error: {shared.last_error})" if blocked else "")
        )
        clean = verdict(catalog, shared)
        print(f"oracle: {'OK: 0 lost, 0 duplicated' if clean else 'VIOLATED'}")
        return 0 if clean and not blocked else 1


if __name__ == "__main__":
    sys.exit(main())
