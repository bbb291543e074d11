"""The code location: every definition is built from the pipeline specs by one loop."""

from __future__ import annotations

from dagster import Definitions

from platform_assets.assets import build_pipeline_assets
from platform_assets.jobs import build_observe_topics_job
from platform_assets.pipelines import load_pipelines
from platform_assets.resources import build_resources
from platform_assets.schedules import build_observe_topics_schedule


def build_definitions() -> Definitions:
    """Build the Definitions for every pipeline in ``pipelines.yaml``."""
    specs = load_pipelines()
    observe_topics = build_observe_topics_job(specs)
    return Definitions(
        assets=[asset for spec in specs for asset in build_pipeline_assets(spec)],
        jobs=[observe_topics],
        schedules=[build_observe_topics_schedule(observe_topics)],
        resources=build_resources(),
    )


defs = build_definitions()
