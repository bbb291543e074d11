"""The replica readiness check as a Dagster asset check of the pipeline's table, on two real
brokers with real MirrorMaker 2 (dedicated mode, the session's shared process) between them:
each way it fails names its fix, and it passes once MM2 has what a failover needs. The replica
comes from the platform configuration."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from dagster import AssetCheckKey, AssetSelection, DagsterInstance

from ingestion.spec.pipeline import PipelineSpec
from platform_assets.definitions import build_definitions
from platform_assets.dr.checks import replica_config_problems
from platform_assets.ingest.checks import pipeline_check_keys
from platform_assets.pipelines import table_key
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource
from tests.support.dagster_runs import materialize_pipeline
from tests.support.mirror_maker import Flow, MirrorMaker
from tests.support.pipelines import make_spec

pytestmark = pytest.mark.integration
CHECK = "replica_dr_ready"


def commit_group(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """What the platform's offset mirror does after a commit: store the group's offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


Setup = Callable[..., tuple[PipelineSpec, Flow, Callable[..., Any]]]
LANE = {None: "mm", 3: "mmcp3", 1: "mmcpdel"}  # checkpoints topic partitions -> its lane


@pytest.fixture
def replicated(
    shared_mm2: MirrorMaker,
    create_topic: Callable[..., str],
    catalog_resource: IcebergCatalogResource,
    spark_resource: SparkResource,
    request: pytest.FixtureRequest,
) -> Setup:
    """A pipeline with replica 'dr' in its spec and the configuration, the session's MM2
    mirroring its topic (the copy made; ``checkpoints``: the number of partitions of the wrong
    checkpoints topic the lane's flow found when it started, ``tests.support.mirror_maker.LANES``,
    which MM2 then uses as it is), and ``evaluate()``: the check through Dagster, returning its
    evaluation."""

    def _make(
        policy: str = "default", max_age_s: float = 300, checkpoints: int | None = None
    ) -> Any:
        lane = shared_mm2.lane(LANE[checkpoints])
        base = f"{lane.source_alias}-{abs(hash(request.node.nodeid)) % 10**8}"
        topic = create_topic(partitions=3, name=base)
        producer = Producer({"bootstrap.servers": lane.source})
        for i in range(12):
            producer.produce(topic, value=b"{}", key=str(i).encode(), partition=i % 3)
        producer.flush(10)
        replica = {"name": "dr", "source_alias": lane.source_alias, "replication_policy": policy}
        name = f"rc{abs(hash(request.node.nodeid)) % 10**6}"
        spec = make_spec(
            topic,
            name,
            consumer_group_id=f"{base}-group",
            replicas=[{**replica, "max_checkpoint_age_seconds": 300}],
        )
        mirror = lane.narrowed([topic], [spec.consumer_group_id])
        mirror.wait_mirrored(topic)
        kafka = KafkaResource(
            bootstrap_servers=mirror.source, replicas={"dr": {"bootstrap.servers": mirror.target}}
        )
        resources = {"kafka": kafka, "iceberg": catalog_resource, "spark": spark_resource}

        def evaluate(age_s: float = max_age_s) -> Any:
            checked = spec.model_copy(
                update={
                    "replicas": [
                        spec.replicas[0].model_copy(update={"max_checkpoint_age_seconds": age_s})
                    ]
                }
            )
            key = AssetCheckKey(table_key(spec), CHECK)
            with DagsterInstance.ephemeral() as instance:
                result = materialize_pipeline(
                    checked, resources, AssetSelection.checks(key), instance
                )
                (evaluation,) = result.get_asset_check_evaluations()
            return evaluation

        return spec, mirror, evaluate

    return _make


def test_the_check_is_one_of_the_pipelines_checks_and_alerts_like_them() -> None:
    spec = make_spec("t", "rc_keys", replicas=[{"name": "dr", "source_alias": "primary"}])
    assert AssetCheckKey(table_key(spec), CHECK) in pipeline_check_keys(spec)
    problems = replica_config_problems([spec], KafkaResource(bootstrap_servers="b:9092"))
    assert problems == [
        "pipeline 'rc_keys': replicas[0].name: replica 'dr' is not in the platform "
        "configuration: add replicas.dr (bootstrap_servers, properties) to it"
    ]


def test_the_check_runs_in_run_checks_not_in_every_ingestion_run() -> None:
    """It reads MM2's topics on both clusters: in an ingestion run it waited out its timeout
    whenever the failover's source was down
    (``platform_assets.ingest.jobs.ingestion_selection``)."""
    spec = make_spec("t", "rc_path", replicas=[{"name": "dr", "source_alias": "primary"}])
    key = AssetCheckKey(table_key(spec), CHECK)
    defs = build_definitions([spec])
    ingest = defs.resolve_job_def("ingest_rc_path_job").asset_layer.asset_graph
    assert key not in ingest.asset_check_keys
    assert AssetCheckKey(table_key(spec), "commit_freshness") in ingest.asset_check_keys
    run_checks = defs.resolve_job_def("run_checks").asset_layer.asset_graph
    assert key in run_checks.asset_check_keys


def test_a_group_that_never_committed_fails_then_passes_once_it_has(replicated: Setup) -> None:
    spec, mirror, evaluate = replicated()  # records copied, but the group has no offsets:
    failing = evaluate()  # MM2 writes no checkpoint
    assert not failing.passed
    assert failing.severity.value == "ERROR"
    assert "has no committed offsets on the source cluster" in (failing.description or "")
    assert "emits no checkpoints" in (failing.description or "")
    commit_group(mirror.source, spec.consumer_group_id, mirror.topics[0], {0: 2, 1: 2, 2: 2})
    for partition in range(3):
        mirror.wait_checkpoint(spec.consumer_group_id, mirror.topics[0], partition, 2)
    passing = evaluate()
    assert passing.passed, passing.description
    assert passing.metadata["checkpoints_topic"].value == mirror.checkpoints_topic


def test_a_stale_checkpoint_fails_the_check(replicated: Setup) -> None:
    spec, mirror, evaluate = replicated()
    commit_group(mirror.source, spec.consumer_group_id, mirror.topics[0], {0: 2})
    mirror.wait_checkpoint(spec.consumer_group_id, mirror.topics[0], 0, 2)
    # The group stands still, so MM2 writes no newer checkpoint (it writes one only when the
    # translated offset moves): past the age limit the check cannot tell this from a stopped
    # checkpoint connector, and says so.
    time.sleep(1.2)
    stale = evaluate(age_s=1)
    assert not stale.passed
    assert "the checkpoint connector is stopped or lagging; restart it" in (stale.description or "")
    assert stale.metadata["checkpoint_age_s"].value >= 1


@pytest.mark.parametrize(
    ("policy", "checkpoints", "fix"),
    [
        ("default", 3, "has 3 partitions; MM2 needs exactly 1"),
        ("default", 1, "set cleanup.policy=compact"),
        ("identity", None, "add it to MM2's topics filter, or fix the replication policy"),
    ],
    ids=["three-partitions", "not-compacted", "no-copy"],
)
def test_a_broken_mirror_fails_the_check_naming_the_fix(
    replicated: Setup, policy: str, checkpoints: int | None, fix: str
) -> None:
    spec, mirror, evaluate = replicated(policy, checkpoints=checkpoints)
    commit_group(mirror.source, spec.consumer_group_id, mirror.topics[0], {0: 2})
    mirror.wait_checkpoint(spec.consumer_group_id, mirror.topics[0], 0, 2)
    failing = evaluate()
    assert not failing.passed
    assert fix in (failing.description or "")
