"""A pipeline's state read through the resources (session broker, an embedded catalog of the
test's own): before the table exists, after a run, with the oldest uncommitted record's time
when asked; and after a failover, on the route's cluster under its topic names."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from ingestion.pipeline.run import run_pipeline
from ingestion.table.offsets import FAILOVER_TO, TopicOffsets, commit_properties
from ingestion.table.route import FAILOVER_TOPICS
from ingestion.table.schema import load_or_create_table
from platform_assets.state import read_pipeline_state
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import CreateTopic, NewPipeline, make_spec, records

pytestmark = pytest.mark.integration


def test_the_state_before_and_after_a_run(
    new_pipeline: NewPipeline, kafka: KafkaResource, tmp_path: Path, ledger: Ledger
) -> None:
    topic, spec = new_pipeline("state_read", produce=5, in_process_max_records=10_000)
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path))
    before = read_pipeline_state(spec, kafka, iceberg, with_oldest=True)
    assert not before.table_exists
    assert before.lag() == {(topic, 0): 5}
    first = min(e.timestamp_ms for e in ledger.entries)
    assert before.oldest_uncommitted_ms == {(topic, 0): first}
    assert read_pipeline_state(spec, kafka, iceberg).oldest_uncommitted_ms == {}  # not asked
    run_pipeline(spec, kafka.client_config(), iceberg.load_catalog(), None, "test")
    after = read_pipeline_state(spec, kafka, iceberg, with_oldest=True)
    assert after.table_exists
    assert after.table_has_rows
    assert after.committed_offsets == {(topic, 0): 5}
    assert after.lag() == {(topic, 0): 0}
    assert after.group_offsets == {(topic, 0): 5}  # mirrored by the run
    assert after.oldest_uncommitted_ms == {}


def test_after_a_failover_the_state_is_read_on_the_routes_topics(
    kafka: KafkaResource,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    tmp_path: Path,
) -> None:
    """The replica is the session broker under another name: the route's topic there is the
    copy, which the spec's own topic is not."""
    copy = create_topic(partitions=1)
    ledger_producer.produce(copy, records(3))
    spec = make_spec(
        "orders-not-created", "state_moved", replicas=[{"name": "dr", "source_alias": "primary"}]
    )
    servers = kafka.bootstrap_servers
    moved_kafka = KafkaResource(
        bootstrap_servers=servers, replicas={"dr": {"bootstrap.servers": servers}}
    )
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path))
    table = load_or_create_table(iceberg.load_catalog(), spec)
    properties = commit_properties(
        group_id=spec.consumer_group_id,
        offsets={copy: TopicOffsets("id", {0: 1})},
        commit_id="switch",
        cluster_id="k-dr",
        pipeline=spec.name,
    )
    names = orjson.dumps({"orders-not-created": copy}).decode()
    switch = {FAILOVER_TO: "dr", FAILOVER_TOPICS: names}
    with (
        table.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties={**properties, **switch}).fast_append(),
    ):
        pass
    state = read_pipeline_state(spec, moved_kafka, iceberg)
    assert state.spec.source_topics == [copy]
    assert state.missing_topics == []
    assert state.lag() == {(copy, 0): 2}
