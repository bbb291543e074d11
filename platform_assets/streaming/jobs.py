"""Continuous mode in Dagster: one long-lived run per pipeline (``stream_<pipeline>_job``).

Its op loops over the engine's ``stream_pipeline``: each non-empty commit is reported as a
materialization of the table asset and of the commit log (the metadata of a normal run). The
lag sensor (``platform_assets/ingest/sensors.py``) starts the run, asks it to stop by tagging it (a
reload of the definitions, a blocked group check), and marks it failed when its heartbeat
stops (a SIGKILLed run process); the stream shares the pipeline's pool with the ingestion job,
so only one ingestion of a pipeline runs at a time.
"""

import contextlib
import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dagster import (
    AssetMaterialization,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    RunsFilter,
    job,
    op,
)

from ingestion.health.checks import GROUP_CHECK, check_group_consistency
from ingestion.health.state import commits_of
from ingestion.health.triggers import commit_interval_seconds
from ingestion.pipeline.run import RunReport
from ingestion.pipeline.stream import stream_pipeline
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.jobs import ACTIVE_RUN_STATUSES
from platform_assets.ingest.metadata import commit_log_metadata, run_metadata
from platform_assets.pipelines import commit_state_key, quarantine_key, table_key
from platform_assets.route import active_route
from platform_assets.state import read_pipeline_state
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource

STOP_TAG = "stream/stop"  # set by the sensor: the reason the stream must stop
HEARTBEAT_TAG = "stream/heartbeat"  # epoch seconds of the stream's last beat (beating)
GENERATION_TAG = "stream/generation"  # the definitions (and spec) the stream was started from


def stream_generation(spec: PipelineSpec, loaded_at: float) -> str:
    """Which definitions a stream runs: the spec and when the code location loaded it."""
    digest = hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:12]
    return f"{digest}@{loaded_at:.0f}"


def stream_job_name(spec: PipelineSpec) -> str:
    """Name of the long-lived job that streams one pipeline."""
    return stream_job_name_of(spec.name)


def stream_job_name_of(pipeline: str) -> str:
    """Name of the stream job of the pipeline called ``pipeline`` (it may no longer exist)."""
    return f"stream_{pipeline}_job"


def stale_after_seconds(spec: PipelineSpec) -> float:
    """A stream whose heartbeat is older than this is dead (its process was killed)."""
    return max(60.0, 10 * commit_interval_seconds(spec))


def active_stream_runs(instance: DagsterInstance, spec: PipelineSpec) -> list[DagsterRun]:
    """The pipeline's stream runs queued or in progress."""
    return list(
        instance.get_runs(RunsFilter(job_name=stream_job_name(spec), statuses=ACTIVE_RUN_STATUSES))
    )


def seconds_since_failure(
    instance: DagsterInstance, spec: PipelineSpec, now: float
) -> float | None:
    """Seconds since the pipeline's newest stream run failed (None if the newest did not)."""
    records = instance.get_run_records(RunsFilter(job_name=stream_job_name(spec)), limit=1)
    if not records or records[0].dagster_run.status != DagsterRunStatus.FAILURE:
        return None
    ended = records[0].end_time
    return now - ended if ended is not None else None


def is_stale(run: DagsterRun, spec: PipelineSpec, now: float, started_at: float | None) -> bool:
    """Whether a started stream stopped beating (no heartbeat: judged from its start time)."""
    beat = run.tags.get(HEARTBEAT_TAG)
    last = float(beat) if beat else started_at
    return last is not None and now - last > stale_after_seconds(spec)


ITERATION_LIMIT_SECONDS = 900.0
"""An iteration running longer than this (or 10 x ``stale_after_seconds``) is hung: its stream
stops beating, so the sensor marks it failed and replaces it."""


def iteration_limit_seconds(spec: PipelineSpec) -> float:
    """How long one stream iteration may run before its stream stops beating (hung)."""
    return max(ITERATION_LIMIT_SECONDS, 10 * stale_after_seconds(spec))


@dataclass
class Heartbeat:
    """The stream's heartbeat, written by a thread (:func:`beating`): every ``every_s`` seconds
    while the current iteration (``iteration_started``, set by :meth:`iteration`) has run for
    less than ``limit_s``."""

    every_s: float
    limit_s: float
    iteration_started: float = field(default_factory=time.monotonic)

    def iteration(self) -> None:
        """An iteration starts (``should_stop`` calls it)."""
        self.iteration_started = time.monotonic()

    def hung(self) -> bool:
        """Whether the current iteration has run past the limit."""
        return time.monotonic() - self.iteration_started > self.limit_s


@contextmanager
def beating(instance: DagsterInstance, run_id: str, heartbeat: Heartbeat) -> Iterator[None]:
    """Write the run's heartbeat every ``heartbeat.every_s`` seconds while the body runs (a
    thread), unless the current iteration is hung.

    A stream beats while its process lives, also inside an iteration that catches up a long
    backlog on Spark: before, it beat only between iterations, so an iteration longer than
    :func:`stale_after_seconds` was judged dead, marked failed and replaced while it still ran
    (issue 29 item 5). An iteration past ``heartbeat.limit_s`` (a Spark job or a client call
    that never returns) stops the beat, so a hung stream is still marked failed and replaced
    (R52; the two then race on the compare-and-set, rule 1). A write that fails is retried at the
    next beat; a killed process stops beating, which is what the sensor looks for."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat.every_s):
            if heartbeat.hung():
                continue
            with contextlib.suppress(Exception):  # the run storage hiccuped: the next beat
                instance.add_run_tags(run_id, {HEARTBEAT_TAG: str(int(time.time()))})

    thread = threading.Thread(target=beat, name=f"heartbeat-{run_id[:8]}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(heartbeat.every_s + 10)


def build_stream_job(spec: PipelineSpec) -> JobDefinition:
    """The long-lived run of a continuous pipeline (see the module docstring)."""
    interval_s = commit_interval_seconds(spec)

    @op(
        name=f"stream_{spec.name}",
        pool=f"ingest_{spec.name}",
        description=f"Commits {spec.name!r} every {interval_s:g} s until asked to stop.",
    )
    def _stream(
        context: OpExecutionContext,
        kafka: KafkaResource,
        iceberg: IcebergCatalogResource,
        spark: SparkResource,
    ) -> None:
        """Delivery: each iteration is one ``run_pipeline`` (ingestion.pipeline.stream): exactly
        once across kills and restarts; a lost compare-and-set re-plans, never overwrites."""
        instance, run_id = context.instance, context.run_id
        catalog = iceberg.load_catalog()
        route = active_route(spec, kafka, iceberg)  # a failover moves it to a replica
        source = route.kafka

        heartbeat = Heartbeat(stale_after_seconds(spec) / 4, iteration_limit_seconds(spec))

        def should_stop() -> str | None:
            heartbeat.iteration()  # the beat itself is the thread's (beating)
            run = instance.get_run_by_id(run_id)
            if run is None or run.status != DagsterRunStatus.STARTED:
                # The sensor marked this run failed (a stale heartbeat: it was slow, not dead)
                # and may have started another: stop, so two streams never run side by side.
                return f"run is {run.status.value if run else 'gone'}, no longer STARTED"
            requested = run.tags.get(STOP_TAG)
            if requested:
                return requested
            finding = check_group_consistency(read_pipeline_state(spec, kafka, iceberg))
            if finding.blocks:  # the lag sensor then records the check in one run
                context.log.error(f"blocked by {GROUP_CHECK.name}: {finding.message}")
                return f"blocked by {GROUP_CHECK.name}"
            now = active_route(spec, kafka, iceberg)
            if now.cluster != route.cluster:  # the sensor starts the next stream on the new route
                context.log.warning(f"{spec.name!r} failed over to {now.cluster!r}; stopping")
                return f"failed over from {route.cluster!r} to {now.cluster!r}"
            if now.spec.source_topics != route.spec.source_topics:  # a failback completed
                context.log.warning(f"{spec.name!r} now reads {now.spec.source_topics}; stopping")
                return f"route changed from {route.spec.source_topics} to {now.spec.source_topics}"
            return None

        def on_report(report: RunReport) -> None:
            for note in report.notes:
                context.log.warning(note)
            for error in (report.dead_letter_error, report.mirror and report.mirror.error):
                if error:
                    context.log.warning(error)
            if not report.committed:
                return  # nothing ingested: no materialization (downstream not rebuilt)
            context.log_event(
                AssetMaterialization(asset_key=table_key(spec), metadata=run_metadata(report))
            )
            if spec.errors_tolerance == "all":
                context.log_event(
                    AssetMaterialization(
                        asset_key=quarantine_key(spec),
                        metadata={
                            "quarantined_this_run": MetadataValue.int(report.quarantined),
                            "table": MetadataValue.text(spec.quarantine_table),
                        },
                    )
                )
            commits = commits_of(catalog.load_table(spec.table), spec.consumer_group_id)
            context.log_event(
                AssetMaterialization(
                    asset_key=commit_state_key(spec),
                    metadata=commit_log_metadata(commits, spec.consumer_group_id),
                )
            )

        avro = spec.value_format == "avro"  # its registry client is closed when it stops
        with (
            beating(instance, run_id, heartbeat),
            (
                source.get_schema_registry_client(spec.schema_registry_url)
                if avro
                else contextlib.nullcontext()
            ) as registry,
        ):
            summary = stream_pipeline(
                route.spec,
                source.client_config(),
                catalog,
                source.get_cluster_id(),
                interval_s,
                should_stop,
                on_report,
                spark=lambda: spark.spark_session,
                run_id=run_id,
                io_properties=iceberg.io_properties(),
                schema_registry=registry,
                on_conflict=lambda message: context.log.warning(
                    f"re-planning after a concurrent commit: {message}"
                ),
                cluster_config=lambda name: kafka.for_cluster(name).client_config(),
                cluster=route.cluster,
            )
        context.log.info(
            f"stream of {spec.name!r} stopped ({summary.stopped_because}) after "
            f"{summary.commits} commits, {summary.records} records, {summary.conflicts} re-plans"
        )

    @job(
        name=stream_job_name(spec),
        description=f"Continuous ingestion of {spec.name!r} ({spec.table}), exactly once.",
        tags={"pipeline": spec.name},
    )
    def _job() -> None:
        _stream()

    return _job


def supervise_streams(
    instance: DagsterInstance, spec: PipelineSpec, generation: str, stop_reason: str | None
) -> bool:
    """Look after the pipeline's stream runs; True while one is alive (queued or beating).

    A started stream whose heartbeat stopped (its process was killed) is marked failed, which
    alerts and frees the pool; one started from other definitions (a reload) or while the
    pipeline is blocked (``stop_reason``) is asked to stop: it ends cleanly between commits.
    """
    alive, now = False, time.time()
    for run in active_stream_runs(instance, spec):
        record = instance.get_run_record_by_id(run.run_id)
        started_at = record.start_time if record is not None else None
        if run.status == DagsterRunStatus.STARTED and is_stale(run, spec, now, started_at):
            instance.report_run_failed(
                run,
                message=f"stream of {spec.name!r} stopped beating for over "
                f"{stale_after_seconds(spec):.0f} s (its process died); the lag sensor starts "
                "a new one, which re-plans from the table's offsets",
            )
            continue
        if run.tags.get(GENERATION_TAG) != generation:
            stop_reason = stop_reason or "the definitions were reloaded: restarting the stream"
        if stop_reason and STOP_TAG not in run.tags:
            instance.add_run_tags(run.run_id, {STOP_TAG: stop_reason})
        alive = True
    return alive
