"""The trigger logic meets a configured freshness target on the real stack (`make dev`: broker,
catalog, demo producer, `dagster dev` with its daemon), judged from the table alone: each
record's Kafka timestamp against the commit time of the snapshot that made it queryable.

The bounds are generous (the figure belongs to scripts/freshness.py): the shipped demo
pipeline's target is 15 s, below the run-per-commit floor, so it streams; every record of the
window must be queryable within twice the target, and commits must come from the stream run.
The stack is the session's shared one (tests/support/dev_stack.py), fresh when this test runs.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from typing import Any

import pytest

from ingestion.health.latency import measure_latency
from ingestion.health.state import commits_of
from ingestion.health.triggers import is_continuous
from ingestion.kafka.topics import describe_topic
from ingestion.spec.pipeline import load_pipeline_specs
from ingestion.table.offsets import RUN_ID
from platform_assets.pipelines import PIPELINES_FILE
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.dev_stack import DevStack, graphql

pytestmark = pytest.mark.integration
TABLE, GROUP, TOPIC = "demo.orders", "platform-orders", "orders"
WINDOW_S = 25
"""The window whose records are judged: longer than the shipped target (15 s), so it spans
commits of the stream run; the long measurement is scripts/freshness.py's."""


def test_shipped_target_is_met_through_dagster(dev_stack: DevStack) -> None:
    assert dev_stack.pipelines.read_text() == PIPELINES_FILE.read_text()  # as shipped
    (spec,) = [s for s in load_pipeline_specs(PIPELINES_FILE) if s.name == "orders"]
    target = spec.freshness_target_seconds
    assert target is not None
    assert is_continuous(spec)
    catalog = IcebergCatalogResource(state_dir=str(dev_stack.state_dir))
    bootstrap = re.search(r"Kafka:\s+(\S+)", dev_stack.banner)
    assert bootstrap, dev_stack.banner
    kafka = KafkaResource(bootstrap_servers=bootstrap[1])
    started_ms = int(time.time() * 1000)

    def newest_commit() -> dict[tuple[str, int], int] | None:
        loaded = catalog.load_catalog()
        if not loaded.table_exists(TABLE):
            return None
        found = commits_of(loaded.load_table(TABLE), GROUP, limit=1)
        return found[0].offsets if found and found[0].timestamp_ms >= started_ms else None

    deadline = time.monotonic() + 240
    while newest_commit() is None and time.monotonic() < deadline:
        time.sleep(1)
    log = f"{dev_stack.state_dir}/logs/dagster.log"
    assert newest_commit() is not None, f"no commit within 240 s; log: {log}"
    since_ms = int(time.time() * 1000)
    time.sleep(WINDOW_S)
    until_ms = int(time.time() * 1000)
    # The window's last records commit: wait until a commit covers every record the demo
    # producer (a flush every 0.5 s) wrote by 2 s after the window, or until twice the target.
    time.sleep(2)
    consumer = kafka.get_consumer()
    try:
        ends = describe_topic(kafka.get_admin_client(), consumer, TOPIC).end_offsets
    finally:
        consumer.close()
    while time.time() * 1000 < until_ms + 2 * target * 1000:
        offsets = newest_commit() or {}
        if all(offsets.get((TOPIC, p), 0) >= end for p, end in ends.items()):
            break
        time.sleep(1)
    table = catalog.load_catalog().load_table(TABLE)
    latency = measure_latency(table, GROUP, since_ms, until_ms)
    runs = graphql(
        dev_stack.port,
        '{ runsOrError(filter: {pipelineName: "stream_pipelines_job"}) { ... on Runs { '
        "results { runId status } } } }",
    )
    print(f"\n{latency.line()}")
    assert latency.records >= WINDOW_S * 40  # ~50 events/s were produced, all are in the table
    assert latency.max_s <= 2 * target, latency
    assert latency.commit_interval_s <= target, latency
    stream_runs = {r["runId"] for r in runs["data"]["runsOrError"]["results"]}  # type: ignore[index]
    run_ids = {c.properties.get(RUN_ID) for c in commits_of(table, GROUP, limit=1000)}
    assert run_ids <= stream_runs, (run_ids, stream_runs)
    assert_spark_did_every_batch(dev_stack, latency.commits)


def assert_spark_did_every_batch(dev_stack: DevStack, commits: int) -> None:
    """The demo's batches run their tasks on the Spark Connect server `make dev`
    starts: every materialization of the table says ``executed_in: spark`` with its Spark tasks,
    and the server's Spark UI lists the jobs, tagged with the pipeline."""
    events = graphql(
        dev_stack.port,
        '{ assetOrError(assetKey: {path: ["iceberg", "demo", "orders"]}) { ... on Asset { '
        "assetMaterializations(limit: 50) { metadataEntries { label "
        "... on TextMetadataEntry { text } ... on IntMetadataEntry { intValue } } } } } }",
    )
    materializations = events["data"]["assetOrError"]["assetMaterializations"]  # type: ignore[index]
    assert len(materializations) >= min(commits, 50) > 0
    for materialization in materializations:
        entries = {e["label"]: e for e in materialization["metadataEntries"]}
        assert entries["executed_in"]["text"] == "spark", entries["executed_in"]
        assert entries["spark_tasks"]["intValue"] >= 1
    ui = re.search(r"Spark UI:\s+(\S+)", dev_stack.banner)
    assert ui, dev_stack.banner
    (application,) = read_json(f"{ui[1]}/api/v1/applications")
    jobs = read_json(f"{ui[1]}/api/v1/applications/{application['id']}/jobs")
    tagged = [job for job in jobs if "platform-pipeline-orders" in " ".join(job.get("jobTags", []))]
    assert len(tagged) >= min(commits, len(jobs)) > 0, jobs[:3]
    # The lanes' jobs share the executors fairly (resources/fairscheduler.xml).
    environment = read_json(f"{ui[1]}/api/v1/applications/{application['id']}/environment")
    conf = dict(environment["sparkProperties"])
    assert conf["spark.scheduler.mode"] == "FAIR", conf.get("spark.scheduler.mode")
    assert conf["spark.scheduler.allocation.file"].endswith("fairscheduler.xml")


def read_json(url: str, within_s: float = 120.0) -> Any:
    """GET ``url`` as JSON, retried: the Spark UI's first answers can take longer than a socket
    timeout on a loaded 2-core machine (one full run timed out at 10 s)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as answer:
                return json.load(answer)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
