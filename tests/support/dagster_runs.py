"""A pipeline's Dagster assets and checks, materialized in process."""

from __future__ import annotations

from typing import Any

from dagster import AssetSelection, DagsterInstance, ExecuteInProcessResult, materialize

from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.assets import build_pipeline_assets
from platform_assets.ingest.checks import build_pipeline_checks


def materialize_pipeline(
    spec: PipelineSpec,
    resources: dict[str, Any],
    selection: AssetSelection | None = None,
    instance: DagsterInstance | None = None,
    tags: dict[str, str] | None = None,
) -> ExecuteInProcessResult:
    """Materialize the pipeline's assets and checks (``selection``: some of them); a failed run
    is returned, not raised."""
    return materialize(
        [*build_pipeline_assets(spec), build_pipeline_checks(spec)],
        resources=resources,
        selection=selection,
        raise_on_error=False,
        instance=instance,
        tags=tags,
    )
