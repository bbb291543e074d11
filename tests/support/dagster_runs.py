"""A pipeline's Dagster assets and checks, materialized in process."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import yaml
from dagster import (
    AssetSelection,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    ExecuteInProcessResult,
    ScheduleDefinition,
    build_schedule_context,
    materialize,
)

from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.assets import build_pipeline_assets
from platform_assets.ingest.checks import build_pipeline_checks
from platform_assets.pipelines import ingest_job_name


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


def job_execute_setup(
    tmp_path: Path, spec: PipelineSpec, bootstrap_servers: str, state_dir: str
) -> tuple[dict[str, str], list[str]]:
    """What a user's ``dagster job execute`` of ``spec``'s ingest job needs: a DAGSTER_HOME
    (telemetry off) and a pipelines file holding ``spec`` under ``tmp_path``; return the
    environment to add to the caller's (the broker, the catalog's state, no Spark Connect) and
    the command."""
    home = tmp_path / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)  # a benchmark repeats its runs in one instance
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    pipelines = tmp_path / "pipelines.yaml"
    raw = spec.model_dump(mode="json", by_alias=True)
    pipelines.write_text(yaml.safe_dump({"pipelines": [raw]}))
    env = {
        "DAGSTER_HOME": str(home),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
        "PLATFORM_STATE_DIR": state_dir,
        "PLATFORM_PIPELINES_FILE": str(pipelines),
        "PLATFORM_SPARK_REMOTE": "",
    }
    command = [str(Path(sys.executable).with_name("dagster")), "job", "execute"]
    command += ["-m", "platform_assets.definitions", "-j", ingest_job_name(spec)]
    return env, command


def add_serving_worker(instance: DagsterInstance, *specs: PipelineSpec) -> DagsterRun:
    """A stream worker's run record in ``instance``: STARTED, beating now and serving ``specs``,
    as the sensors and ``hold_ingestion`` read it (no process behind it)."""
    from platform_assets.streaming.jobs import (
        HEARTBEAT_TAG,
        SERVING_TAG,
        STREAM_JOB,
        dump_tag_map,
        spec_version,
    )

    serving = dump_tag_map({spec.name: spec_version(spec) for spec in specs})
    return instance.add_run(
        DagsterRun(
            job_name=STREAM_JOB,
            status=DagsterRunStatus.STARTED,
            tags={SERVING_TAG: serving, HEARTBEAT_TAG: str(int(time.time()))},
        )
    )


def evaluate_schedule(
    schedule: ScheduleDefinition, instance: DagsterInstance, resources: dict[str, Any]
) -> Any:
    """One tick of ``schedule`` on ``instance``, its context closed when the tick returns.

    ``build_schedule_context`` keeps only the instance's ref: the first use opens a second
    instance from it, entered (current for the thread) until the context is exited. A context
    left open kept that instance current, and its collection later, in another test, made a
    dead instance's storage current again: the next definitions build failed with "Attempted to
    resolve undefined DagsterInstance weakref" (seen once in a full run)."""
    with build_schedule_context(instance=instance, resources=resources) as context:
        return schedule.evaluate_tick(context)
