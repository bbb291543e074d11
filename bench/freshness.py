"""Produce -> queryable latency with the lag sensor's decision and the engine, in one loop.

The loop calls the same code paths as ``make dev``: the sensor's ``decide`` on the state that
``read_state`` reads, then ``run_pipeline`` when it says so. Unlike ``make dev`` it keeps one
warm Spark session (a Dagster run starts its own, about 8 s here: add it to these figures).
"""

from __future__ import annotations

import bisect
import random
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import NewTopic

from bench.workloads import spec_for
from ingestion.health.lag import measure_lag_age
from ingestion.health.state import commits_of, read_state
from ingestion.health.triggers import decide
from ingestion.pipeline.run import run_pipeline
from platform_assets.demo import encode_event, make_order_event
from resources.kafka import KafkaResource
from resources.spark import SparkResource


def _produce_steadily(kafka: KafkaResource, topic: str, rate: int, stop: threading.Event) -> None:
    producer = kafka.get_producer(**{"linger.ms": 5})
    rng, sequence, tick = random.Random(7), 0, 0.25
    while not stop.is_set():
        started = time.monotonic()
        for _ in range(max(1, int(rate * tick))):
            event = make_order_event(rng, sequence)
            producer.produce(topic, key=event["order_id"].encode(), value=encode_event(event))
            sequence += 1
        producer.flush(10)
        stop.wait(max(0.0, tick - (time.monotonic() - started)))
    producer.flush(10)


def measure_freshness(
    kafka: KafkaResource,
    catalog: Any,
    state_dir: Path,
    seconds: int,
    rate: int = 200,
    interval_s: float = 15.0,
) -> dict[str, Any]:
    """Produce at ``rate`` for ``seconds`` while the sensor loop ingests; latency percentiles."""
    topic = "fresh"
    admin = kafka.get_admin_client()
    for future in admin.create_topics([NewTopic(topic, 4, 1)]).values():
        future.result(15)
    spec = spec_for("fresh", topic, None).model_copy(
        update={"max_lag_records": 500, "max_lag_seconds": 60}
    )
    spark_resource = SparkResource(master="local[2]")
    spark = spark_resource.spark_session
    spark.range(8).collect()
    stop = threading.Event()
    producer = threading.Thread(target=_produce_steadily, args=(kafka, topic, rate, stop))
    producer.start()
    runs, started = 0, time.monotonic()
    while True:
        table = catalog.load_table(spec.table) if catalog.table_exists(spec.table) else None
        consumer = kafka.get_consumer()
        try:
            state = read_state(spec, table, admin, consumer, kafka.client_config())
        finally:
            consumer.close()
        lag = sum(state.lag().values())
        age = measure_lag_age(state, int(time.time() * 1000)).seconds
        launch, _ = decide(lag, age, spec, busy=False)
        if launch:
            run_pipeline(spec, kafka.client_config(), catalog, spark, kafka.get_cluster_id())
            runs += 1
        elapsed = time.monotonic() - started
        if elapsed >= seconds and not stop.is_set():
            stop.set()
            producer.join()
        if stop.is_set() and (lag == 0 or elapsed > seconds + 180):
            break
        time.sleep(interval_s)
    spark_resource.stop_session()
    table = catalog.load_table(spec.table)
    commits = sorted(
        commits_of(table, spec.consumer_group_id, limit=10_000),
        key=lambda c: c.timestamp_ms,
    )
    rows = table.scan(
        selected_fields=("_kafka_partition", "_kafka_offset", "_kafka_timestamp")
    ).to_arrow()
    latencies = []
    for partition, offset, stamp in zip(
        rows.column(0).to_pylist(),
        rows.column(1).to_pylist(),
        rows.column(2).to_pylist(),
        strict=True,
    ):
        ends = [c.offsets.get((topic, partition), 0) for c in commits]
        committed = commits[bisect.bisect_right(ends, offset)]  # first commit past the offset
        latencies.append(committed.timestamp_ms / 1000 - stamp.timestamp())
    latencies.sort()

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1)

    return {
        "records": len(latencies),
        "rate_per_s": rate,
        "runs": runs,
        "sensor_interval_s": interval_s,
        "p50_s": pct(0.5),
        "p95_s": pct(0.95),
        "max_s": round(latencies[-1], 1),
    }
