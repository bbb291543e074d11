"""The pipeline specs this code location serves, and the asset keys derived from them."""

from __future__ import annotations

import os
from collections.abc import Set as AbstractSet
from pathlib import Path

from dagster import AssetKey

from ingestion.spec.pipeline import PipelineSpec, load_pipeline_specs

PIPELINES_FILE = Path(__file__).with_name("pipelines.yaml")
PIPELINES_FILE_ENV = "PLATFORM_PIPELINES_FILE"


def pipelines_file() -> Path:
    """The specs file: ``$PLATFORM_PIPELINES_FILE`` when set, else the configuration's
    ``pipelines_file``, else ``pipelines.yaml`` here.

    Read when the code location loads (every *Reload definitions*), not at import.
    """
    from resources.config import load_config

    return Path(
        os.environ.get(PIPELINES_FILE_ENV) or load_config().pipelines_file or PIPELINES_FILE
    )


def load_pipelines(path: Path | None = None) -> list[PipelineSpec]:
    """Load and validate the pipeline specs; an invalid spec stops the code location loading."""
    return load_pipeline_specs(path or pipelines_file())


def topic_asset_keys(spec: PipelineSpec) -> list[AssetKey]:
    """One asset key per source topic; a pattern pipeline gets one key for its pattern."""
    if spec.topic_pattern is not None:
        return [AssetKey(["kafka", f"{spec.name}_topics"])]
    return [AssetKey(["kafka", topic]) for topic in spec.source_topics]


INGEST_ALL_JOB = "ingest_all"
"""The job that ingests every pipeline, or those a run selects (the fallback schedules')."""


def ingest_job_name(spec: PipelineSpec) -> str:
    """Name of the job that ingests one pipeline."""
    return f"ingest_{spec.name}_job"


def ingests(job_name: str, assets: AbstractSet[AssetKey] | None, spec: PipelineSpec) -> bool:
    """Whether a run of ``job_name`` that selected ``assets`` (None: all of its job's) ingests
    ``spec``: a run of the pipeline's own job, or of ``ingest_all`` unless it selected other
    pipelines only (a fallback run selects one)."""
    if job_name == ingest_job_name(spec):
        return True
    return job_name == INGEST_ALL_JOB and (assets is None or table_key(spec) in assets)


def table_key(spec: PipelineSpec) -> AssetKey:
    """The Iceberg table asset: ``iceberg/<namespace>/<table>``."""
    return AssetKey(["iceberg", *spec.table.split(".")])


def quarantine_key(spec: PipelineSpec) -> AssetKey:
    """The quarantine (dead-letter) table asset."""
    return AssetKey(["iceberg", *spec.quarantine_table.split(".")])


def commit_state_key(spec: PipelineSpec) -> AssetKey:
    """The coordinator's commit log of the pipeline."""
    return AssetKey(["ingestion", spec.name, "commit_state"])


def ingestion_keys(spec: PipelineSpec) -> list[AssetKey]:
    """Every asset one ingestion run materializes."""
    keys = [table_key(spec), commit_state_key(spec)]
    return keys + ([quarantine_key(spec)] if spec.errors_tolerance == "all" else [])
