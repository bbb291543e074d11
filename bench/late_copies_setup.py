"""The guarded routes of the late-copy suite (bench/late_copies.py), set up as production does.

A pipeline with replica ``dr`` reads its topic on the primary; MirrorMaker 2's forward flow
(the stand-in of tests/support/mm2_standin.py, MM2's formats) copies a head of records to
``dr`` and checkpoints the group; the table then ingests an RPO tail MM2 never copies; and the
operator's ``platform failover <pipeline> --to dr --source-lost`` is applied
(``platform_assets.dr.failover.failover_pipeline``): the switch writes ``kafka.uncopied.<group>``
with the tail. The primary stays up: runs on the route read the originals there to compare.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from bench.workloads import order_record, produce, spec_for
from ingestion.dr.align import key_digest
from ingestion.dr.late_copies.guard import read_guard
from ingestion.pipeline.run import run_pipeline
from ingestion.spec.pipeline import PipelineSpec, parse_pipeline_spec
from platform_assets.dr.failover import failover_pipeline
from platform_assets.route import Route, active_route

HEAD_PER_PARTITION = 1  # records MM2 copied before the disaster (each with an offset sync)
SMALL = 10_000  # runs of at most this many offsets (the smoke test's) are prepared in-process


@dataclass(frozen=True)
class Original:
    """An uncopied record as the table ingested it on the primary (a late copy repeats it)."""

    partition: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Any


@dataclass(frozen=True)
class Routed:
    """A case's pipeline: its spec, its route after the switch, the tail's originals."""

    spec: PipelineSpec
    route: Route
    originals: list[Original]
    head: int


def plain_spec(name: str, topic: str) -> PipelineSpec:
    """The bench's orders pipeline (``spec_for``) on ``topic``; runs of at most ``SMALL``
    offsets in-process, larger ones on Spark."""
    return spec_for(name, topic, None).model_copy(update={"in_process_max_records": SMALL})


def route_spec(name: str, topic: str) -> PipelineSpec:
    """:func:`plain_spec` with replica ``dr``."""
    raw = spec_for(name, topic, None).model_dump(by_alias=True)
    replicas = [{"name": "dr", "source_alias": "primary"}]
    return parse_pipeline_spec({**raw, "replicas": replicas, "in_process_max_records": SMALL})


def guard_routes(
    kafka: Any, iceberg: Any, tails: dict[str, int], partitions: int
) -> dict[str, Routed]:
    """Per pipeline name in ``tails``: a topic on the primary, MM2's copy on dr, a tail of that
    many records ingested and never copied, and the ``--source-lost`` switch to dr.

    Not idempotent: a fresh catalog and fresh clusters only (the bench's own).
    """
    from confluent_kafka.admin import NewTopic

    from tests.support.mm2_standin import MirrorStandIn

    primary, dr = kafka.client_config(), kafka.for_cluster("dr").client_config()
    catalog = iceberg.load_catalog()
    specs = {name: route_spec(name, f"lc-{name}") for name in tails}
    topics = [spec.source_topics[0] for spec in specs.values()]
    admin = kafka.get_admin_client()
    for future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
        future.result(15)
    forward = MirrorStandIn(
        primary["bootstrap.servers"],
        dr["bootstrap.servers"],
        topics,
        [s.consumer_group_id for s in specs.values()],
        source_alias="primary",
    ).setup()
    head = HEAD_PER_PARTITION * partitions
    cluster_id = kafka.get_cluster_id()
    for spec in specs.values():
        produce(primary, spec.source_topics[0], head, partitions)
        run_pipeline(spec, primary, catalog, None, cluster_id)
    forward.step()  # the head copied; checkpoints at the table's offsets
    stamp = int(time.time() * 1000) - max(tails.values())  # the tails end now, 1 record/ms
    routed = {}
    for name, spec in specs.items():
        topic = spec.source_topics[0]
        tail = make_round(tails[name], partitions, 7, first=head, stamp_ms=stamp)
        send(primary, topic, tail)  # the RPO tail, stamped (its originals are known)
        run_pipeline(spec, primary, catalog, None, cluster_id)  # ingested, never copied
        lines = failover_pipeline(
            spec,
            kafka,
            iceberg,
            "dr",
            dry_run=False,
            requested_by="bench",
            reason="bench: primary lost with an RPO tail",
            source_lost=True,
        )
        expected = f"the table ingested {tails[name]} record(s) MirrorMaker 2 had not copied"
        if not any(expected in line for line in lines):
            raise RuntimeError(f"{name}: the switch did not record the tail:\n" + "\n".join(lines))
        route = active_route(spec, kafka, iceberg)
        guard = read_guard(catalog.load_table(spec.table), spec.consumer_group_id, name)
        originals = [Original(p, t or 0, k, v, h) for p, k, v, t, h, _ in tail]
        sent = {(o.timestamp_ms, key_digest(o.key)) for o in originals}
        recorded = {w for ids in guard.weak_ids().values() for w in ids} if guard else set()
        if route.cluster != "dr" or recorded != sent:  # the switch recorded exactly the tail
            raise RuntimeError(f"{name}: route {route.cluster}, {len(recorded)} uncopied recorded")
        routed[name] = Routed(spec, route, originals, head)
    return routed


def near_miss(original: Original) -> Original:
    """Another record with ``original``'s timestamp and key: one more item ordered."""
    value = original.value or b""
    changed = value.replace(b'"items":', b'"items":1', 1)
    if changed == value:
        raise ValueError("the near miss must differ from its original")
    return Original(original.partition, original.timestamp_ms, original.key, changed, None)


Outgoing = tuple[int, bytes | None, bytes | None, int | None, Any, str]
"""(partition, key, value, timestamp ms or None for now, headers, tag: '' or what to note)."""


def make_round(
    records: int, partitions: int, seed: int, first: int = 0, stamp_ms: int | None = None
) -> list[Outgoing]:
    """``records`` order events (ids from ``first``) round-robin over ``partitions``, stamped
    when produced, or ``stamp_ms`` plus one per record."""
    rng = random.Random(seed)
    out: list[Outgoing] = []
    for i in range(records):
        key, value = order_record(rng, first + i)
        stamp = None if stamp_ms is None else stamp_ms + i
        out.append((i % partitions, key, value, stamp, None, ""))
    return out


def with_extras(base: list[Outgoing], extras: list[tuple[Original, str]]) -> list[Outgoing]:
    """``base`` with ``extras`` (late copies, near misses) spread evenly through it."""
    out = list(base)
    step = max(1, len(base) // (len(extras) + 1))
    for j, (o, tag) in reversed(list(enumerate(extras, start=1))):
        out.insert(
            min(j * step, len(out)), (o.partition, o.key, o.value, o.timestamp_ms, o.headers, tag)
        )
    return out


def send(config: dict[str, Any], topic: str, records: list[Outgoing]) -> list[tuple[str, int, int]]:
    """Produce ``records`` in order; the (tag, partition, offset) of each tagged one. Each
    partition's last record goes in a batch of its own (a habit from a broker whose end offsets
    under-counted batches; harmless on Kafka)."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **config,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "enable.idempotence": True,
        }
    )
    noted: list[tuple[str, int, int]] = []
    last = {r[0]: i for i, r in enumerate(records)}
    held = []
    for i, record in enumerate(records):
        if last[record[0]] == i:
            held.append(record)
            continue
        _produce(producer, topic, record, noted)
    producer.flush(120)
    for record in held:
        _produce(producer, topic, record, noted)
    producer.flush(60)
    if len(noted) != sum(1 for r in records if r[5]):
        raise RuntimeError(f"{topic}: a tagged record was not delivered")
    return noted


def _produce(producer: Any, topic: str, record: Outgoing, noted: list) -> None:
    partition, key, value, stamp, headers, tag = record

    def delivered(err: Any, msg: Any) -> None:
        if err is None and tag:
            noted.append((tag, msg.partition(), msg.offset()))

    options = {"timestamp": stamp} if stamp is not None else {}
    while True:
        try:
            producer.produce(
                topic,
                value=value,
                key=key,
                partition=partition,
                headers=headers,
                on_delivery=delivered,
                **options,
            )
            return
        except BufferError:
            producer.poll(0.05)
