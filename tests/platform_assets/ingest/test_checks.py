"""The table asset's checks (platform_assets/ingest/checks.py) evaluated by Dagster on a real
instance, broker and catalog: the exactly-once audit's memory survives a blocked pipeline."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import AssetCheckKey, AssetSelection, DagsterInstance, materialize

from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.assets import build_pipeline_assets
from platform_assets.ingest.checks import build_pipeline_checks, previous_audit_memory
from platform_assets.pipelines import table_key
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource
from tests.support.pipelines import Harness, NewPipeline

pytestmark = pytest.mark.integration


def evaluate_audit(spec: PipelineSpec, resources: dict[str, Any], instance: DagsterInstance) -> Any:
    """One evaluation of the pipeline's checks, as run_checks runs them; the audit's result."""
    result = materialize(
        [*build_pipeline_assets(spec), build_pipeline_checks(spec)],
        resources=resources,
        selection=AssetSelection.checks_for_assets(table_key(spec)),
        instance=instance,
        raise_on_error=False,  # the blocking group check fails the run while blocked
    )
    (audit,) = [
        e for e in result.get_asset_check_evaluations() if e.check_name == "exactly_once_audit"
    ]
    return audit


def test_the_audit_cursor_survives_a_long_block(
    harness: Harness,
    new_pipeline: NewPipeline,
    kafka: KafkaResource,
    catalog_resource: IcebergCatalogResource,
    spark_resource: SparkResource,
) -> None:
    """R47: while the group check blocks, every run_checks records the audit as
    "not evaluated". Those results carried no cursor, and the memory was searched in the last 10
    records: after ten blocked evaluations (about 50 minutes of run_checks) the cursor was gone,
    maintenance kept nothing for the audit, and the audit restarted at the newest commits and
    passed. Now a blocked result carries the memory on: twelve blocked evaluations later the
    cursor is the one the last real evaluation left."""
    _, spec = new_pipeline("audit_memory", produce=10)
    harness.run(spec, use_spark=False)
    resources = {"kafka": kafka, "iceberg": catalog_resource, "spark": spark_resource}
    key = AssetCheckKey(table_key(spec), "exactly_once_audit")
    with DagsterInstance.ephemeral() as instance:
        first = evaluate_audit(spec, resources, instance)
        assert first.passed, first.description
        cursor = first.metadata["audit_cursor"].value
        assert cursor == str(harness.table(spec).metadata.current_snapshot_id)
        wrong = spec.model_copy(update={"consumer_group_id": f"{spec.consumer_group_id}-typo"})
        for _ in range(12):
            blocked = evaluate_audit(wrong, resources, instance)
            assert blocked.metadata["blocked_by"].value == "group_id_consistency"
            assert blocked.metadata["audit_cursor"].value == cursor
        memory = previous_audit_memory(instance, key)
        assert memory is not None
        assert str(memory.cursor) == cursor
        assert memory.group == spec.consumer_group_id  # a migration's new group audits afresh
        again = evaluate_audit(spec, resources, instance)
        assert again.passed, again.description
        assert again.metadata["audit_cursor"].value == cursor
