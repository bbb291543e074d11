"""The code location: every definition is built from the pipeline specs by one loop."""

from collections.abc import Callable

from dagster import Definitions, JobDefinition

from ingestion.health.triggers import is_continuous
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.alerts.sensors import build_check_alert_sensor, run_failure_alert_sensor
from platform_assets.dbt.assets import (
    build_dbt_assets,
    build_dbt_automation_sensor,
    dbt_resource,
    load_dbt_project,
)
from platform_assets.ingest.assets import build_pipeline_assets
from platform_assets.ingest.checks import build_pipeline_checks, pipeline_check_keys
from platform_assets.ingest.jobs import (
    AssetJob,
    build_ingest_all_job,
    build_ingest_job,
    build_observe_topics_job,
    build_run_checks_job,
)
from platform_assets.ingest.schedules import (
    build_checks_schedule,
    build_fallback_schedules,
    build_maintenance_schedules,
    build_observe_topics_schedule,
)
from platform_assets.ingest.sensors import build_lag_sensor
from platform_assets.operations.jobs import build_ops_jobs
from platform_assets.pipelines import load_pipelines, table_key
from platform_assets.resources import build_resources
from platform_assets.streaming.jobs import build_stream_job, code_generation
from platform_assets.streaming.sensors import build_stream_sensor
from resources.config import load_config


def build_definitions(specs: list[PipelineSpec] | None = None) -> Definitions:
    """Build the Definitions for ``specs`` (default: every pipeline in ``pipelines.yaml``)."""
    given = specs
    specs = load_pipelines() if given is None else given
    assets, checks, sensors, schedules = [], [], [], []
    jobs: list[JobDefinition | AssetJob] = []
    ingest_jobs = [build_ingest_job(spec) for spec in specs]
    for spec in specs:
        assets += build_pipeline_assets(spec)
        checks.append(build_pipeline_checks(spec))
    jobs += ingest_jobs
    # One lag sensor and one set of schedules for all the pipelines, each tick one pass.
    ingest_all = build_ingest_all_job(specs)
    if specs:  # a sensor must target at least one job
        sensors.append(build_lag_sensor(specs, ingest_jobs))
    schedules += [*build_fallback_schedules(specs, ingest_all), *build_maintenance_schedules(specs)]
    # The streaming pipelines share a bounded number of worker runs (platform_assets/streaming):
    # the job and its sensor exist with no streaming pipeline too, to stop a worker left running.
    workers = load_config().streaming.workers
    jobs.append(build_stream_job(load_pipelines if given is None else fixed(given)))
    sensors.append(
        build_stream_sensor(
            [spec for spec in specs if is_continuous(spec)], code_generation(workers), workers
        )
    )
    observe, run_checks = build_observe_topics_job(specs), build_run_checks_job(specs)
    check_keys = [key for spec in specs for key in pipeline_check_keys(spec)]
    dbt_project = load_dbt_project()
    return Definitions(
        assets=[*assets, build_dbt_assets(dbt_project)],
        asset_checks=checks,
        jobs=[*jobs, ingest_all, observe, run_checks, *operator_jobs(specs)],
        schedules=[
            *schedules,
            build_observe_topics_schedule(observe),
            build_checks_schedule(run_checks),
        ],
        sensors=[
            *sensors,
            build_check_alert_sensor(check_keys, {table_key(spec): spec.name for spec in specs}),
            run_failure_alert_sensor,
            build_dbt_automation_sensor(),
        ],
        resources={**build_resources(), "dbt": dbt_resource(dbt_project)},
    )


def fixed(specs: list[PipelineSpec]) -> Callable[[], list[PipelineSpec]]:
    """The specs a stream worker reads when the definitions were built from a given list."""
    return lambda: list(specs)


def operator_jobs(specs: list[PipelineSpec]) -> list[JobDefinition]:
    """Reset, migrate and maintain; the failover job too once a pipeline declares replicas
    (disaster recovery is an add-on: without replicas none of it is loaded)."""
    jobs = build_ops_jobs(specs)
    if any(spec.replicas for spec in specs):
        from platform_assets.dr.jobs import build_failover_job

        jobs.append(build_failover_job(specs))
    return jobs


defs = build_definitions()
