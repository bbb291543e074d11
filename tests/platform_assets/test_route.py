"""Which cluster a pipeline reads now, and under which topic names, as the table records it
(real embedded catalog, no Kafka): the primary without replicas, without a table or before a
switch; after a failover the replica's resource and MM2's names; after a failback the reverse
copies and the origin topics put back next to them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from ingestion.table.offsets import FAILOVER_TO, TopicOffsets, commit_properties
from ingestion.table.route import FAILOVER_ORIGIN, FAILOVER_TOPICS
from ingestion.table.schema import load_or_create_table
from platform_assets.route import PRIMARY, Route, active_route
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.pipelines import make_spec

SPEC = make_spec(
    "x",
    "routed",
    topics=["orders", "payments"],
    replicas=[{"name": "dr", "source_alias": "primary"}],
)
KAFKA = KafkaResource(
    bootstrap_servers="primary:9092", replicas={"dr": {"bootstrap.servers": "dr:9092"}}
)


@pytest.fixture
def iceberg(tmp_path: Path) -> IcebergCatalogResource:
    return IcebergCatalogResource(state_dir=str(tmp_path))


def switch(iceberg: IcebergCatalogResource, cluster_id: str, **properties: str) -> None:
    """Commit the group's offsets under ``cluster_id`` with the switch ``properties``."""
    table = load_or_create_table(iceberg.load_catalog(), SPEC)
    offsets = commit_properties(
        group_id=SPEC.consumer_group_id,
        offsets={"orders": TopicOffsets("id", {0: 1})},
        commit_id=cluster_id,
        cluster_id=cluster_id,
        pipeline=SPEC.name,
    )
    with (
        table.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties={**offsets, **properties}).fast_append(),
    ):
        pass


def test_the_primary_without_replicas_a_table_or_a_switch(
    iceberg: IcebergCatalogResource,
) -> None:
    plain = make_spec("orders", "plain")
    assert active_route(plain, KAFKA, iceberg) == Route(PRIMARY, plain, KAFKA)
    assert active_route(SPEC, KAFKA, iceberg) == Route(PRIMARY, SPEC, KAFKA)  # no table yet
    switch(iceberg, "k-primary")
    assert active_route(SPEC, KAFKA, iceberg) == Route(PRIMARY, SPEC, KAFKA)


def test_after_a_failover_the_replica_under_mm2s_names(iceberg: IcebergCatalogResource) -> None:
    switch(iceberg, "k-primary")
    names = {"orders": "primary.orders", "payments": "primary.payments"}
    switch(iceberg, "k-dr", **{FAILOVER_TO: "dr", FAILOVER_TOPICS: orjson.dumps(names).decode()})
    route = active_route(SPEC, KAFKA, iceberg)
    assert route.cluster == "dr"
    assert route.spec.source_topics == ["primary.orders", "primary.payments"]
    assert route.kafka.client_config() == {"bootstrap.servers": "dr:9092"}
    assert (route.spec.name, route.spec.table) == (SPEC.name, SPEC.table)


def test_after_a_failback_the_reverse_copies_and_the_origins_put_back(
    iceberg: IcebergCatalogResource,
) -> None:
    switch(iceberg, "k-primary")
    back = {"orders": "dr.orders", "payments": "dr.payments"}
    origin = orjson.dumps([{"topic": "orders", "partition": 0}]).decode()
    switch(
        iceberg,
        "k-back",
        **{
            FAILOVER_TO: PRIMARY,
            FAILOVER_TOPICS: orjson.dumps(back).decode(),
            FAILOVER_ORIGIN: origin,
        },
    )
    route = active_route(SPEC, KAFKA, iceberg)
    assert route.cluster == PRIMARY
    assert route.spec.source_topics == ["dr.orders", "dr.payments", "orders"]
    assert route.kafka is KAFKA
