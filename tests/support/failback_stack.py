"""One failover/failback setup on two real clusters, shared by the failback tests.

A pipeline reads ``topic`` on the source cluster with replica ``dr`` on the other one (the
``dr_clusters`` pair of tests/conftest.py, reset for each module); the stack holds its spec, its
resources and MM2's flows: real MirrorMaker 2 processes (tests/support/mirror_maker.py),
:attr:`FailbackStack.mm2` forward (primary -> dr) and :meth:`FailbackStack.reverse_mm2`
(dr -> primary), created here, started and stopped by the test (a flow stopped is MM2 falling
behind: what producers write meanwhile is the RPO tail), stopped at the fixture's teardown.
Tests get it from the ``failback_stack`` fixture::

    stack = failback_stack("cmpl", "dr_cmpl", replica={"source_alias": "eastc"})
    with stack.forward_mm2 as forward:  # MM2 primary -> dr runs
        forward.wait_mirrored("cmpl")
    stack.ingest_route()  # one engine run on the active route

Nothing is mocked: the topics, the MM2 records, the SQL catalog and the engine runs are real.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import ConsumerGroupTopicPartitions, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from ingestion.dr.mm2 import replica_topic
from ingestion.ops.maintenance import expire_snapshots
from ingestion.pipeline.mirror import wait_for_group_coordinator
from ingestion.pipeline.run import run_pipeline
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.dr.failover import failover_pipeline
from platform_assets.route import active_route
from resources.embedded import EmbeddedBroker
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.mirror_maker import MirrorMaker
from tests.support.pipelines import make_spec, records

STAMP = 1_790_000_000_000
"""The CreateTime (ms) the failback tests stamp their records from."""


@dataclass
class FailbackStack:
    """A pipeline with replica 'dr', its resources and MM2's flows between the two clusters."""

    source: EmbeddedBroker
    replica: EmbeddedBroker
    spec: PipelineSpec
    iceberg: IcebergCatalogResource
    kafka: KafkaResource
    catalog: Catalog
    mm2: MirrorMaker
    tmp_path: Path
    running: list[MirrorMaker]  # real MM2 flows the fixture stops

    @property
    def group(self) -> str:
        """The pipeline's consumer group (MM2 checkpoints it)."""
        return self.spec.consumer_group_id

    @property
    def copy(self) -> str:
        """MM2's copy of the pipeline's topic on the replica (and, identity, back on the
        primary: the reverse copy)."""
        replica = self.spec.replicas[0]
        topic = self.spec.source_topics[0]
        return replica_topic(topic, replica.source_alias, replica.replication_policy)

    @property
    def resources(self) -> dict[str, Any]:
        """The Dagster resources of the failover job (no Spark)."""
        return {"kafka": self.kafka, "iceberg": self.iceberg}

    def ingest_route(self, other_clusters: bool = False) -> set[str]:
        """One engine run (in process) on the active route; the topics it planned. With
        ``other_clusters`` the run can read the other clusters, as the ingestion asset does (to
        tell MM2's late copies: ``ingestion.dr.late_copies.guard``).

        Delivery: the run commits its offsets with its rows; a failed run commits nothing and
        the next one reads the same records again.
        """
        route = active_route(self.spec, self.kafka, self.iceberg)
        cluster = route.kafka.get_cluster_id()
        config = route.kafka.client_config()
        kafka = self.kafka
        report = run_pipeline(
            route.spec,
            config,
            self.catalog,
            None,
            cluster,
            cluster=route.cluster,
            cluster_config=(lambda name: kafka.for_cluster(name).client_config())
            if other_clusters
            else None,
        )
        return {key[0] for key in report.end_offsets}

    def fail_over(self) -> list[str]:
        """Switch the pipeline to 'dr' (the operator's ``--to dr``); the plan's lines."""
        return failover_pipeline(
            self.spec,
            self.kafka,
            self.iceberg,
            "dr",
            dry_run=False,
            requested_by="ops",
            reason="down",
        )

    def fail_back(self, source_lost: bool = False) -> list[str]:
        """Switch the pipeline back to the primary (``--to primary``; with ``source_lost``,
        ``--source-lost``: 'dr' is not read); the plan's lines."""
        return failover_pipeline(
            self.spec,
            self.kafka,
            self.iceberg,
            "primary",
            dry_run=False,
            requested_by="ops",
            reason="dr lost" if source_lost else "back",
            source_lost=source_lost,
        )

    @property
    def forward_mm2(self) -> MirrorMaker:
        """The real forward flow (not started)."""
        return self.mm2

    def reverse_mm2(
        self, identity: bool = True, target_alias: str | None = None, **options: Any
    ) -> MirrorMaker:
        """MM2's real reverse flow dr -> primary of the copy (not started): the replica's
        failback alias as the source alias, the forward flow's source alias (or
        ``target_alias``) as the target alias, identity naming unless told otherwise;
        ``options``: :class:`~tests.support.mirror_maker.MirrorMaker`'s keyword options."""
        source_alias = self.spec.replicas[0].failback_alias
        target = target_alias or self.forward_mm2.source_alias
        clusters = {
            source_alias: self.replica.bootstrap_servers,
            target: self.source.bootstrap_servers,
        }
        reverse = MirrorMaker(
            self.tmp_path / "mm2-reverse.log",
            clusters,
            source_alias,
            target,
            [self.copy],
            [self.group],
            identity=identity,
            **options,
        )
        self.running.append(reverse)
        return reverse

    def head(self) -> Snapshot | None:
        """The table's current snapshot, freshly loaded."""
        return self.catalog.load_table(self.spec.table).current_snapshot()

    def landed_keys(self) -> list[str]:
        """The Kafka keys of the table's rows, sorted (a record landed twice shows twice)."""
        table = self.catalog.load_table(self.spec.table)
        keys = table.scan(selected_fields=("_kafka_key",)).to_arrow()
        return sorted(keys.column("_kafka_key").to_pylist())


StackFactory = Callable[..., FailbackStack]
"""``failback_stack(topic, name, partitions=2, replica={...}, forward={...}, config=False,
**spec_overrides)`` -> a :class:`FailbackStack`: the fixture."""


def build_failback_stack(
    source: EmbeddedBroker,
    replica: EmbeddedBroker,
    tmp_path: Path,
    topic: str,
    name: str,
    partitions: int = 2,
    replica_spec: dict[str, str] | None = None,
    forward: dict[str, Any] | None = None,
    running: list[MirrorMaker] | None = None,
    **overrides: Any,
) -> FailbackStack:
    """Create ``topic`` on ``source``, a pipeline ``name`` reading it (``make_spec``, at most
    10,000 records in process, replica 'dr' with ``replica_spec``, then ``overrides``), its
    resources (the catalog under ``tmp_path/state``) and the real forward MM2 flow
    (``forward``: its keyword options; not started), added to ``running``."""
    admin = AdminClient({"bootstrap.servers": source.bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(10)
    dr = {"name": "dr", "source_alias": "primary", **(replica_spec or {})}
    settings = {"in_process_max_records": 10_000, "replicas": [dr], **overrides}
    spec = make_spec(topic, name, **settings)
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path / "state"))
    kafka = KafkaResource(
        bootstrap_servers=source.bootstrap_servers,
        replicas={"dr": {"bootstrap.servers": replica.bootstrap_servers}},
    )
    options = dict(forward or {})
    target_alias = options.pop("target_alias", "backup")
    clusters = {
        dr["source_alias"]: source.bootstrap_servers,
        target_alias: replica.bootstrap_servers,
    }
    mm2 = MirrorMaker(
        tmp_path / f"mm2-{name}.log",
        clusters,
        dr["source_alias"],
        target_alias,
        [topic],
        [spec.consumer_group_id],
        **options,
    )
    running = running if running is not None else []
    running.append(mm2)
    catalog = iceberg.load_catalog()
    return FailbackStack(source, replica, spec, iceberg, kafka, catalog, mm2, tmp_path, running)


def failback_factory(
    clusters: tuple[EmbeddedBroker, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    running: list[MirrorMaker] | None = None,
) -> StackFactory:
    """The ``failback_stack`` fixture's factory on ``clusters`` (source, replica); with
    ``config=True`` it also writes the platform configuration (:func:`write_config`) and points
    ``PLATFORM_CONFIG`` at it, for tests of the CLI and the Dagster jobs; real MM2 flows go to
    ``running`` (the fixture stops them)."""
    source, dr = clusters

    def build(
        topic: str,
        name: str,
        *,
        replica: dict[str, str] | None = None,
        config: bool = False,
        **options: Any,
    ) -> FailbackStack:
        stack = build_failback_stack(
            source, dr, tmp_path, topic, name, replica_spec=replica, running=running, **options
        )
        if config:
            path = write_config(
                tmp_path, source.bootstrap_servers, dr.bootstrap_servers, stack.spec
            )
            monkeypatch.setenv("PLATFORM_CONFIG", str(path))
            monkeypatch.delenv("PLATFORM_PIPELINES_FILE", raising=False)
            monkeypatch.delenv("DAGSTER_HOME", raising=False)
        return stack

    return build


def write_config(tmp_path: Path, source: str, replica: str, spec: PipelineSpec) -> Path:
    """The platform configuration with replica 'dr', and the pipelines file it names."""
    pipelines = tmp_path / "pipelines.yaml"
    raw = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    pipelines.write_text(yaml.safe_dump({"pipelines": [raw]}))
    config = tmp_path / "platform.yaml"
    document = {
        "kafka": {"bootstrap_servers": source},
        "catalog": {"state_dir": str(tmp_path / "state")},
        "replicas": {"dr": {"bootstrap_servers": replica}},
        "pipelines_file": str(pipelines),
    }
    config.write_text(yaml.safe_dump(document))
    return config


def send(bootstrap: str, topic: str, numbers: list[int], stamp_ms: int) -> None:
    """Records ``k<n>`` on partition ``n % 2``, stamped ``stamp_ms + n`` (CreateTime)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for number in numbers:
        ((key, value, _),) = records(1, first=number)
        producer.produce(
            topic, value=value, key=key, partition=number % 2, timestamp=stamp_ms + number
        )
        producer.flush(10)


def group_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The Kafka group's committed offsets on one cluster."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wait_for_group_coordinator(admin, group, 10)  # librdkafka #5040: see ingestion/pipeline/mirror
    (future,) = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    listed = future.result(10).topic_partitions or []
    return {(tp.topic, tp.partition): tp.offset for tp in listed}


def exactly_once(target_alias: str) -> dict[str, str]:
    """MM2 properties that make a flow into ``target_alias`` copy in transactions (Kafka
    Connect's exactly-once source support, a worker setting: under the target's prefix)."""
    return {f"{target_alias}.exactly.once.source.support": "enabled"}


def committed(cluster: EmbeddedBroker, group: str, topic: str) -> list[tuple[int, int]]:
    """``group``'s committed offsets of ``topic`` on ``cluster``, for the partitions MM2 can
    checkpoint (a partition it wrote an offset sync for: one that holds a copied record)."""
    offsets = group_offsets(cluster.bootstrap_servers, group)
    return [(p, n) for (t, p), n in sorted(offsets.items()) if t == topic and n > 0]


def wait_checkpointed(mm2: MirrorMaker, cluster: EmbeddedBroker, group: str, topic: str) -> None:
    """Until real MM2 (``mm2``, whose source is ``cluster``) has checkpointed ``group`` where
    it stands now on ``topic``."""
    for partition, upstream in committed(cluster, group, topic):
        mm2.wait_checkpoint(group, topic, partition, upstream)


def expire_all(table: Table, group: str) -> int:
    """Expire every snapshot expiry may remove (all older than now); how many it removed."""
    time.sleep(0.01)
    expired, _ = expire_snapshots(table, int(time.time() * 1000), {group})
    return expired
