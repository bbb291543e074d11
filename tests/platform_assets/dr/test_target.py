"""Where a switch goes and how its plan reads to an operator, without Kafka: the target as seen
from the route (a failback reads the reverse flow: its alias and policy, MM2's syncs on the
replica), the switches refused before anything is read, and one line per partition of a plan."""

from __future__ import annotations

import pytest

from ingestion.dr.failover import PartitionPlan
from ingestion.dr.replica_check import ReplicaTarget
from ingestion.exceptions import FailoverRefusedError
from platform_assets.dr.target import describe_local_topics, describe_plan, failover_target
from platform_assets.route import PRIMARY, Route
from resources.kafka import KafkaResource
from tests.support.pipelines import make_spec

SPEC = make_spec(
    "orders",
    "target",
    replicas=[
        {"name": "dr", "source_alias": "primary", "target_alias": "dr-alias"},
    ],
)
KAFKA = KafkaResource(
    bootstrap_servers="primary:9092", replicas={"dr": {"bootstrap.servers": "dr:9092"}}
)
# A second replica the platform configuration lacks.
WITH_WEST = make_spec(
    "orders",
    "target",
    replicas=[
        {"name": "dr", "source_alias": "primary", "target_alias": "dr-alias"},
        {"name": "west", "source_alias": "primary"},
    ],
)
ON_PRIMARY = Route(PRIMARY, SPEC, KAFKA)
ON_DR = Route(
    "dr",
    SPEC.model_copy(update={"topic": None, "topics": ["primary.orders"]}),
    KAFKA.for_cluster("dr"),
)


def test_a_failover_targets_the_replica_under_the_forward_flows_naming() -> None:
    goal = failover_target(ON_PRIMARY, SPEC, KAFKA, "dr")
    assert goal.target == ReplicaTarget(
        "dr", {"bootstrap.servers": "dr:9092"}, "primary", "default"
    )
    assert goal.syncs_topic == "mm2-offset-syncs.dr-alias.internal"  # on the primary
    assert goal.kafka.client_config() == {"bootstrap.servers": "dr:9092"}


def test_a_failback_targets_the_primary_under_the_reverse_flows_naming() -> None:
    goal = failover_target(ON_DR, SPEC, KAFKA, PRIMARY)
    assert goal.target == ReplicaTarget(
        PRIMARY, {"bootstrap.servers": "primary:9092"}, "dr", "identity"
    )
    assert goal.syncs_topic == "mm2-offset-syncs.primary.internal"  # on the replica


@pytest.mark.parametrize(
    ("route", "to", "refusal"),
    [
        (ON_PRIMARY, PRIMARY, "already reads from 'primary'; nothing to do$"),
        (ON_DR, "dr", "already reads from 'dr'"),
        (ON_DR, "other", "reads from replica 'dr': fail back to primary first"),
        (ON_PRIMARY, "west", "no replica cluster 'west' in the configuration"),
    ],
)
def test_switches_that_cannot_be_made_are_refused_before_anything_is_read(
    route: Route, to: str, refusal: str
) -> None:
    with pytest.raises(FailoverRefusedError, match=refusal):
        failover_target(route, WITH_WEST, KAFKA, to)


def test_on_the_primary_after_a_failback_completion_is_asked_first() -> None:
    failed_back = Route(
        PRIMARY, SPEC.model_copy(update={"topic": None, "topics": ["dr.orders", "orders"]}), KAFKA
    )
    with pytest.raises(FailoverRefusedError, match="platform complete-failback target"):
        failover_target(failed_back, SPEC, KAFKA, PRIMARY)
    with pytest.raises(FailoverRefusedError, match="Complete the failback first"):
        failover_target(failed_back, SPEC, KAFKA, "dr")


def test_a_plan_reads_one_line_per_partition_and_notes_uncopied_records() -> None:
    plans = [
        PartitionPlan("orders", 0, 12, "primary.orders", "id", 10, 2, "checkpoint 10"),
        PartitionPlan("orders", 1, 7, "primary.orders", "id", 5, 0, "offset sync", uncopied=3),
    ]
    lines = describe_plan(plans)
    assert lines[:2] == [
        "orders[0] at 12 -> primary.orders[0] from 10 (2 copies already ingested; checkpoint 10)",
        "orders[1] at 7 -> primary.orders[1] from 5 (0 copies already ingested; offset sync); "
        "3 ingested record(s) have no copy",
    ]
    assert lines[2].startswith("note: the table ingested 3 record(s) MirrorMaker 2 had not")
    assert describe_plan(plans, note=False) == lines[:2]
    assert describe_plan(plans[:1]) == lines[:1]


def test_identity_naming_has_no_local_topic_to_warn_about() -> None:
    """Nothing is read: the target's settings point nowhere."""
    target = ReplicaTarget("dr", {"bootstrap.servers": "nowhere:1"}, "primary", "identity")
    assert describe_local_topics(SPEC, {"orders": "orders"}, target) == []
