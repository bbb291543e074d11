"""Failover and failback wired into the platform, end to end on two real clusters.

The primary stops (SIGSTOP) in the middle of a stream; ``platform failover --dry-run`` shows the
plan and commits nothing, ``platform failover --to dr`` switches, and the pipeline's Dagster
ingestion asset then reads the replica with no configuration change. The primary comes back, a
reverse MirrorMaker 2 flow (the stand-in) copies the replica's topic to it, producers keep
writing to the replica, and the Dagster ``failover`` job fails the pipeline back to primary in
the middle of that stream. The oracle, by source record identity: every record once. The
exactly-once audit recounts each commit on the cluster it read."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from dagster import AssetSelection, DagsterInstance

from ingestion.exceptions import OperationRefusedError
from ingestion.offsets import RESET_BY, RESET_REASON
from ingestion.spec import PipelineSpec
from platform_assets.checks import audit_finding
from platform_assets.cli import main
from platform_assets.cli_actions import parse_position
from platform_assets.operations import reset_offsets
from platform_assets.ops_jobs import build_ops_jobs
from platform_assets.pipelines import quarantine_key, table_key
from platform_assets.replica_checks import replica_finding
from platform_assets.route import active_route
from resources.embedded import EmbeddedBroker
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource
from tests.support.dagster_runs import materialize_pipeline
from tests.support.failover_stream import oracle, produce
from tests.support.mm2_standin import MirrorStandIn
from tests.support.pipelines import make_spec

pytestmark = pytest.mark.integration
NAME = "dr_wired"


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


def ingest(spec: PipelineSpec, resources: dict[str, Any], cap: int | None = None) -> None:
    """One run of the pipeline's Dagster ingestion asset (it reads the active route)."""
    capped = spec.model_copy(update={"max_records_per_run": cap}) if cap else spec
    selection = AssetSelection.assets(table_key(spec), quarantine_key(spec)).without_checks()
    with DagsterInstance.ephemeral() as instance:
        result = materialize_pipeline(capped, resources, selection, instance)
    assert result.success, [e.message for e in result.all_events if e.is_failure]


def test_failover_then_failback_through_the_cli_and_the_job_land_every_record_once(
    dr_clusters: tuple[EmbeddedBroker, EmbeddedBroker],
    spark_resource: SparkResource,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, replica = dr_clusters
    admin = AdminClient({"bootstrap.servers": source.bootstrap_servers})
    for future in admin.create_topics([NewTopic("orders", 3, 1)]).values():
        future.result(10)
    spec = make_spec(
        "orders", NAME, errors_tolerance="all", max_records_per_run=70,
        in_process_max_records=10_000, replicas=[{"name": "dr", "source_alias": "primary"}],
    )  # fmt: skip
    config = write_config(tmp_path, source.bootstrap_servers, replica.bootstrap_servers, spec)
    monkeypatch.setenv("PLATFORM_CONFIG", str(config))
    monkeypatch.delenv("PLATFORM_PIPELINES_FILE", raising=False)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path / "state"))
    kafka = KafkaResource(
        bootstrap_servers=source.bootstrap_servers,
        replicas={"dr": {"bootstrap.servers": replica.bootstrap_servers}},
    )
    resources = {"kafka": kafka, "iceberg": iceberg, "spark": spark_resource}
    catalog = iceberg.load_catalog()
    group = spec.consumer_group_id

    # On the primary, mirrored by MM2 (transactional copies: replica offsets drift).
    produce(source.bootstrap_servers, "orders", 0, 100)
    forward = MirrorStandIn(
        source.bootstrap_servers, replica.bootstrap_servers, ["orders"], [group],
        sync_every=9, transactional=True,
    ).setup()  # fmt: skip
    ingest(spec, resources)  # 70 of 100
    forward.step()  # all copied; the checkpoint says the group is at the table's 70
    produce(source.bootstrap_servers, "orders", 100, 30)
    ingest(spec, resources, cap=40)  # 110 of 130: past the checkpoint
    forward.replicate()  # all 130 copied, no newer checkpoint
    os.kill(source.pid or 0, signal.SIGSTOP)  # disaster

    args = ["failover", NAME, "--to", "dr", "--reason", "primary down", "--by", "ops@example.com"]
    assert main([*args, "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert "failover of 'dr_wired': primary -> dr" in shown
    assert "orders[0] at " in shown
    assert "-> primary.orders[0] from " in shown
    assert "dry run: nothing committed" in shown
    assert active_route(spec, kafka, iceberg).cluster == "primary"
    assert main(args) == 0
    assert "switched to 'dr'" in capsys.readouterr().out
    route = active_route(spec, kafka, iceberg)
    assert (route.cluster, route.spec.source_topics) == ("dr", ["primary.orders"])
    switch = catalog.load_table(spec.table).current_snapshot()
    assert switch is not None
    assert switch.summary is not None
    recorded = switch.summary.additional_properties
    assert (recorded[RESET_BY], recorded[RESET_REASON]) == ("ops@example.com", "primary down")
    # A reset addresses the spec's topics on the primary: on a moved route it would switch the
    # pipeline back without a plan, so it is refused, nothing changed.
    with pytest.raises(OperationRefusedError, match="not supported on a moved route"):
        reset_offsets(spec, kafka, iceberg, parse_position("latest"), True, "ops", "wrong")
    assert catalog.load_table(spec.table).current_snapshot() == switch

    ingest(spec, resources)  # the Dagster asset now reads the replica: the 20 not ingested
    oracle(catalog, spec, 130)

    # The primary is back; producers write to the replica; a reverse flow copies it back.
    os.kill(source.pid or 0, signal.SIGCONT)
    way_back = replica_finding(spec, spec.replicas[0], kafka, iceberg)
    assert not way_back.passed
    assert "'dr.checkpoints.internal' does not exist on the replica" in way_back.message
    produce(replica.bootstrap_servers, "primary.orders", 130, 20)
    ingest(spec, resources, cap=10)  # 140 of 150, on the replica
    reverse = MirrorStandIn(
        replica.bootstrap_servers, source.bootstrap_servers, ["primary.orders"], [group],
        source_alias="dr", target_alias="primary", identity=True, sync_every=7,
        transactional=True,
    ).setup()  # fmt: skip
    reverse.step()
    ready = replica_finding(spec, spec.replicas[0], kafka, iceberg)
    assert ready.passed, ready.message
    ingest(spec, resources, cap=5)  # 145 of 150: past the reverse checkpoint
    reverse.replicate()

    failover_job = build_ops_jobs([spec])[3]
    with DagsterInstance.ephemeral() as instance:
        back = failover_job.execute_in_process(
            run_config={
                "ops": {
                    "failover_pipeline": {
                        "config": {"pipeline": NAME, "to": "primary", "apply": True,
                                   "reason": "primary is back"}
                    }
                }
            },
            resources=resources,
            instance=instance,
        )  # fmt: skip
    assert back.success
    route = active_route(spec, kafka, iceberg)
    assert (route.cluster, route.spec.source_topics) == ("primary", ["primary.orders"])
    ingest(spec, resources)  # the last 5, from the primary's copy
    oracle(catalog, spec, 150)
    ingest(spec, resources)
    oracle(catalog, spec, 150)
    audit = audit_finding(spec, iceberg, kafka)
    assert audit.passed, audit.message


def test_a_rewind_of_a_topic_name_read_on_two_clusters_is_refused_loudly() -> None:
    """After a failback under identity naming the table read ``primary.orders`` on two
    clusters; its rows do not record the cluster, so a backward reset that deletes
    "rows at or after X" would take rows read on the other cluster: refused, naming the
    pipeline and what to do. A forward reset, or a name read on one cluster, goes ahead."""
    from ingestion.exceptions import AmbiguousRewindError
    from ingestion.operations import refuse_ambiguous_rewind

    both = {"primary.orders": {"dr-cluster", "primary-cluster"}}
    with pytest.raises(AmbiguousRewindError) as refused:
        refuse_ambiguous_rewind(NAME, {("primary.orders", 1): (79, 70)}, both)
    message = str(refused.value)
    assert f"pipeline {NAME!r}" in message
    assert "primary.orders[1] (79 -> 70)" in message
    assert "failback_replication_policy: default" in message
    assert "nothing was changed" in message
    refuse_ambiguous_rewind(NAME, {("primary.orders", 1): (79, 85)}, both)  # forward
    refuse_ambiguous_rewind(NAME, {("primary.orders", 1): (None, 0)}, both)  # first commit
    one = {"primary.orders": {"primary-cluster"}}
    refuse_ambiguous_rewind(NAME, {("primary.orders", 1): (79, 70)}, one)
