"""A failover in the middle of a stream: the source cluster stops (SIGSTOP), the pipeline is
switched to its MM2 replica from the checkpoints alone, ingestion continues there, and every
source record is in the table exactly once (by source identity: its key), none lost, none twice.
The stream holds malformed records (quarantined) near the switch and a partition that never got
a record; real MirrorMaker 2 (dedicated mode) appends its copies after records the replica topic
already held, so their offsets differ from the source's."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ingestion.dr.failover import plan_failover
from ingestion.dr.replica_check import ReplicaTarget, read_checkpoints
from ingestion.dr.replica_reader import read_offset_syncs
from ingestion.dr.switch import FAILOVER_TO, apply_failover, spec_on_replica
from ingestion.pipeline.run import run_pipeline
from ingestion.table.offsets import find_committed_state
from ingestion.table.route import active_cluster
from resources.embedded import EmbeddedBroker
from resources.iceberg import IcebergCatalogResource
from tests.support.failover_stream import oracle, produce
from tests.support.mirror_maker import MirrorMaker
from tests.support.pipelines import make_spec

pytestmark = pytest.mark.integration


def test_failover_mid_stream_with_the_source_stopped_lands_every_record_once(
    dr_clusters: tuple[EmbeddedBroker, EmbeddedBroker],
    catalog_resource: IcebergCatalogResource,
    tmp_path: Path,
) -> None:
    source, replica = dr_clusters
    src: dict[str, Any] = {"bootstrap.servers": source.bootstrap_servers}
    dst: dict[str, Any] = {"bootstrap.servers": replica.bootstrap_servers}
    admin = AdminClient({**src})
    for future in admin.create_topics([NewTopic("orders", 3, 1)]).values():
        future.result(10)
    spec = make_spec("orders", "failover_e2e", errors_tolerance="all", max_records_per_run=70)
    catalog = catalog_resource.load_catalog()
    produce(source.bootstrap_servers, "orders", 0, 100)
    clusters = {"primary": source.bootstrap_servers, "dr": replica.bootstrap_servers}
    group = spec.consumer_group_id
    mirror = MirrorMaker(
        tmp_path / "mm2.log", clusters, "primary", "dr", ["orders"], [group], offset_lag_max=8
    )
    replica_admin = AdminClient({**dst})
    replica_admin.create_topics([NewTopic("primary.orders", 3, 1)])["primary.orders"].result(10)
    old = Producer({**dst})
    # Records the replica topic held before MM2 copied into it; none in partition 2: the
    # pipeline reads that one from its log start on the replica (nothing ingested there).
    for partition in (0, 1):
        old.produce("primary.orders", value=b"old", key=b"old", partition=partition)
    old.flush(10)
    run_pipeline(spec, src, catalog, None, "source_cluster")  # 70 of 100 (the run cap)
    with mirror:
        mirror.wait_mirrored("orders")  # all 100 copied
        for partition in (0, 1):  # the checkpoint says the group is at the table's 70
            mirror.wait_checkpoint(group, "orders", partition)
        produce(source.bootstrap_servers, "orders", 100, 30)
        mirror.wait_mirrored("orders")  # all 130 copied
    # MM2 stopped: no newer checkpoint (MM2's checkpoints lag the group)
    capped = spec.model_copy(update={"max_records_per_run": 40})
    run_pipeline(capped, src, catalog, None, "source_cluster")  # 110 of 130: past the checkpoint
    os.kill(source.pid or 0, signal.SIGSTOP)  # disaster: the source stops answering

    committed = find_committed_state(catalog.load_table(spec.table), spec.consumer_group_id)
    assert committed is not None
    offsets = {("orders", p): n for p, n in committed.offsets["orders"].next_offsets.items()}
    assert offsets[("orders", 2)] == 0  # a partition that never got a record
    target = ReplicaTarget("dr", dst, "primary")
    syncs = read_offset_syncs(src, mirror.syncs_topic, timeout_s=3)
    assert syncs == {}  # the source is down: checkpoints only
    plans = plan_failover(
        catalog,
        spec,
        offsets,
        target,
        read_checkpoints(dst, mirror.checkpoints_topic),
        syncs,
        {"orders": "primary.orders"},
    )
    copied = [p for p in plans if p.partition < 2]
    assert all(p.anchor.startswith("checkpoint") for p in copied), plans
    assert all(p.replica_start > p.source_next for p in copied)  # the older record first
    apply_failover(
        catalog,
        spec,
        plans,
        committed.offsets,
        target,
        "replica_cluster",
        AdminClient({**dst}),
        "ops@example.com",
        "source cluster down",
    )
    table = catalog.load_table(spec.table)
    assert active_cluster(table, spec.consumer_group_id) == "dr"
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert snapshot.summary is not None
    assert snapshot.summary.additional_properties[FAILOVER_TO] == "dr"

    on_replica = spec_on_replica(spec, target)
    report = run_pipeline(on_replica, dst, catalog, None, "replica_cluster", cluster="dr")
    assert report.records + report.quarantined == 20  # only what the table had not ingested
    oracle(catalog, spec, 130)
    again = run_pipeline(on_replica, dst, catalog, None, "replica_cluster", cluster="dr")
    assert again.records == 0
    oracle(catalog, spec, 130)


def test_a_failover_planned_before_a_stream_commit_names_the_commit_and_the_hand_over(
    catalog_resource: IcebergCatalogResource,
) -> None:
    """R52: from the CLI, a failover beside a live stream plans for seconds while the
    stream commits every few, and the compare-and-set refused with "plan it again" for ever.
    The refusal names the commit that moved the offsets and the way that works: the Dagster
    job, which hands the stream over, or stopping the stream first."""
    from ingestion.exceptions import FailoverRefusedError
    from ingestion.table.offsets import TopicOffsets, commit_properties
    from ingestion.table.schema import load_or_create_table

    spec = make_spec("orders", "failover_moved")
    catalog = catalog_resource.load_catalog()
    table = load_or_create_table(catalog, spec)
    properties = commit_properties(
        group_id=spec.consumer_group_id,
        offsets={"orders": TopicOffsets("id", {0: 9})},
        commit_id="stream-commit",
        cluster_id="k",
        pipeline=spec.name,
    )
    with (
        table.transaction() as transaction,
        transaction.update_snapshot(snapshot_properties=properties).fast_append(),
    ):
        pass
    planned_from = {"orders": TopicOffsets("id", {0: 5})}  # what the plan read, seconds before
    with pytest.raises(FailoverRefusedError) as refused:
        apply_failover(
            catalog,
            spec,
            [],
            planned_from,
            ReplicaTarget("dr", {}, "primary"),
            "k",
            AdminClient({"bootstrap.servers": "127.0.0.1:1"}),
            "ops",
            "drill",
        )
    message = str(refused.value)
    assert "stream-commit" in message, message
    assert "nothing was changed" in message, message
    assert "Dagster job `failover`, which hands the stream over" in message, message
