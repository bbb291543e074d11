"""A failback's links and origin plan as the Dagster side builds them, without Kafka: per
replica partition the failover moved, its link to the origin partition it copied (cluster
labels only when the rows tell the clusters apart); no origin to read when every origin keeps
its copy's name; refused when the failover is no longer in the table's history; and one line
per origin partition for the operator."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingestion.dr.failback.link import OriginLink
from ingestion.dr.failback.origin import OriginPlan, UndoneSwitch
from ingestion.exceptions import FailoverRefusedError
from platform_assets.dr.failback import (
    describe_origin,
    failback_labels,
    origin_links,
    plan_failback_origin,
)
from platform_assets.route import Route
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.pipelines import make_spec

SPEC = make_spec("orders", "fb", replicas=[{"name": "dr", "source_alias": "primary"}])
KAFKA = KafkaResource(
    bootstrap_servers="nowhere:1", replicas={"dr": {"bootstrap.servers": "nowhere:2"}}
)
SWITCH = UndoneSwitch(
    7,
    [
        {
            "replica_topic": "primary.orders",
            "partition": 0,
            "source_topic": "orders",
            "source_next": 40,
            "replica_start": 38,
            "uncopied": 2,
        },
        {
            "replica_topic": "primary.orders",
            "partition": 1,
            "source_topic": "orders",
            "source_next": 9,
            "replica_start": 9,
        },
    ],
    None,
)
ON_DR = Route(
    "dr",
    SPEC.model_copy(update={"topic": None, "topics": ["primary.orders"]}),
    KAFKA.for_cluster("dr"),
)


def test_each_moved_partition_links_to_the_origin_it_copied() -> None:
    offsets = {("primary.orders", 0): 45, ("primary.orders", 1): 9, ("other", 0): 3}
    links = origin_links(SWITCH, offsets, {"primary.orders": "dr.orders"}, "fb")
    assert links == {
        ("primary.orders", 0): OriginLink(
            ("primary.orders", 0), 45, "dr.orders", ("orders", 0), 40, 38, "fb", uncopied=2
        ),
        ("primary.orders", 1): OriginLink(
            ("primary.orders", 1), 9, "dr.orders", ("orders", 1), 9, 9, "fb"
        ),
    }
    # Rows that record their cluster: each side reads its own; the replica lost: source_down.
    labelled = origin_links(SWITCH, offsets, {"primary.orders": "dr.orders"}, "fb", "dr", True)
    link = labelled[("primary.orders", 0)]
    assert isinstance(link, OriginLink)
    assert (link.origin_cluster, link.replica_cluster, link.source_down) == ("primary", "dr", True)
    # A partition the table has no offsets for, or a topic without a reverse copy: no link.
    assert origin_links(SWITCH, {}, {"primary.orders": "dr.orders"}, "fb") == {}
    assert origin_links(SWITCH, offsets, {}, "fb") == {}


def test_without_the_failover_in_the_history_nothing_is_labelled_or_planned(
    tmp_path: Path,
) -> None:
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path))
    catalog = iceberg.load_catalog()
    assert failback_labels(SPEC, catalog, ON_DR, None) == (None, {})
    with pytest.raises(FailoverRefusedError, match="is not in the table's history"):
        plan_failback_origin(SPEC, catalog, ON_DR, KAFKA, {"primary.orders": "dr.orders"}, {}, None)


def test_an_origin_that_keeps_its_copys_name_is_not_read_again(tmp_path: Path) -> None:
    """MM2's identity naming both ways: the reverse copy *is* the origin topic."""
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    same = Route("dr", SPEC, KAFKA.for_cluster("dr"))
    assert plan_failback_origin(SPEC, catalog, same, KAFKA, {"orders": "orders"}, {}, None) == []


def test_each_origin_partition_says_where_it_resumes_and_what_it_ingests() -> None:
    plans = [
        OriginPlan("orders", 0, "id", 40, 43, 3, 5, "primary.orders", 38, 2, 60, "sync 38->40"),
        OriginPlan("orders", 1, "id", 0, 0, 0, 4, "primary.orders", 0, 0, 0, in_plan=False),
    ]
    assert describe_origin(plans, "dr") == [
        "origin orders[0] (at 40 before the failover) resumes at 43: 3 record(s) were ingested "
        "as copies on 'dr', 5 record(s) of unreplicated tail to ingest (copies up to sync "
        "38->40); 2 more were copied to 'dr' since the failover and arrive through the reverse "
        "copy of primary.orders[0]",
        "origin orders[1] (not in the failover's plan: from its log start 0) resumes at 0: 0 "
        "record(s) were ingested as copies on 'dr', 4 record(s) of unreplicated tail to ingest",
    ]
