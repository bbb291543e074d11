"""Continuous mode in Dagster: a bounded number of long-lived stream runs serve every streaming
pipeline (``stream_pipelines_job``, one run per worker shard; ``streaming.workers`` in the
platform configuration, 1 by default).

Each run is a shared worker (``ingestion.pipeline.worker``): one lane per pipeline it is
assigned, each lane the engine's ``stream_pipeline`` for that pipeline alone, planning and
committing with its own compare-and-set; each non-empty commit is reported as a materialization
of the pipeline's table asset and of its commit log (the metadata of a normal run). The stream
sensor (``platform_assets/streaming/sensors.py``) decides: it starts a worker per shard, writes
each worker's assignment into its run's tags (``stream/pipelines``: a pipeline added, removed,
changed, blocked or held by an operator action changes only that pipeline's lane), asks a
worker to stop when the code changed, and marks failed a worker whose heartbeat stopped. The
worker does: it reconciles its lanes to the assignment every few seconds, publishes the
pipelines it serves (``stream/serving``, what operator actions wait on) and its lanes' failures
(``stream/failures``, alerted per pipeline by the sensor).

So the processes and run slots that streaming takes do not grow with the number of pipelines:
one per worker, however many pipelines it serves.
"""

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

from ingestion.exceptions import PipelineSpecError
from ingestion.health.checks import GROUP_CHECK, check_group_consistency
from ingestion.health.state import commits_of
from ingestion.health.triggers import commit_interval_seconds
from ingestion.pipeline.run import RunReport
from ingestion.pipeline.stream import StreamSummary, stream_pipeline
from ingestion.pipeline.worker import LaneOutcome, StreamWorker
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.jobs import ACTIVE_RUN_STATUSES, operator_holds
from platform_assets.ingest.metadata import commit_log_metadata, run_metadata
from platform_assets.pipelines import commit_state_key, quarantine_key, table_key
from platform_assets.route import active_route
from platform_assets.state import read_pipeline_state
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource

STREAM_JOB = "stream_pipelines_job"
STOP_TAG = "stream/stop"  # set by the sensor: the reason the whole worker must stop
HEARTBEAT_TAG = "stream/heartbeat"  # epoch seconds of the worker's last beat (beating)
GENERATION_TAG = "stream/generation"  # the code (and worker count) the worker was started from
SHARD_TAG = "stream/shard"  # "<index>/<workers>": which pipelines the worker may serve
ASSIGNED_TAG = "stream/pipelines"  # JSON {pipeline: spec version}: written by the sensor
SERVING_TAG = "stream/serving"  # JSON {pipeline: spec version}: the worker's live lanes
FAILURES_TAG = "stream/failures"  # JSON {pipeline: error}: lanes that failed, until they commit

RECONCILE_SECONDS = 2.0  # how often a worker reads its assignment and reaps its lanes
BEAT_SECONDS = 15.0
STALE_AFTER_SECONDS = 60.0  # a worker silent this long is dead (its process was killed)
ITERATION_LIMIT_SECONDS = 900.0
"""A lane iteration running longer than this is hung: the worker stops beating, so the sensor
marks it failed and starts another (R52)."""
RESTART_BACKOFF_SECONDS = 30.0
"""A lane that failed, or stopped by itself (a blocked check), restarts no sooner: a failure that
repeats does not become a storm, and the lag sensor has time to record a blocking check."""


def spec_version(spec: PipelineSpec) -> str:
    """A digest of the spec: a lane runs one version, a changed spec restarts only its lane."""
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:12]


CODE_PACKAGES = ("ingestion", "platform_assets", "resources")


def code_generation(workers: int) -> str:
    """Which code a worker runs: a digest of the packages' Python files, and the worker count.

    A reload that changes only the pipelines file keeps it (the workers pick the change up
    lane by lane); new code, or another number of workers, restarts the workers."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for package in CODE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return f"{digest.hexdigest()[:12]}/{workers}"


def shard_of(pipeline: str, workers: int) -> int:
    """The worker shard serving ``pipeline``: a stable hash, so adding one moves no other.

    Example:
        >>> shard_of("orders", 1)
        0
        >>> shard_of("orders", 4) == shard_of("orders", 4)
        True
    """
    return int(hashlib.sha256(pipeline.encode()).hexdigest()[:8], 16) % workers


def read_tag_map(run: DagsterRun, tag: str) -> dict[str, str]:
    """A JSON map tag of a worker run (``{}`` when absent or unreadable)."""
    with contextlib.suppress(ValueError):
        value = json.loads(run.tags.get(tag) or "{}")
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
    return {}


def dump_tag_map(value: Mapping[str, str]) -> str:
    """The tag value of a map: the same map always gives the same string."""
    return json.dumps(dict(value), sort_keys=True, separators=(",", ":"))


def active_workers(instance: DagsterInstance) -> list[DagsterRun]:
    """The stream worker runs queued or in progress."""
    return list(instance.get_runs(RunsFilter(job_name=STREAM_JOB, statuses=ACTIVE_RUN_STATUSES)))


def active_stream_runs(instance: DagsterInstance, spec: PipelineSpec) -> list[DagsterRun]:
    """The worker runs that stream ``spec`` now, or will when they start: a started worker
    serving it (a live lane), or a queued one assigned it."""
    runs = []
    for run in active_workers(instance):
        started = run.status == DagsterRunStatus.STARTED
        if spec.name in read_tag_map(run, SERVING_TAG if started else ASSIGNED_TAG):
            runs.append(run)
    return runs


def is_stale(run: DagsterRun, now: float, started_at: float | None) -> bool:
    """Whether a started worker stopped beating (no heartbeat: judged from its start time)."""
    beat = run.tags.get(HEARTBEAT_TAG)
    last = float(beat) if beat else started_at
    return last is not None and now - last > STALE_AFTER_SECONDS


@dataclass
class Heartbeat:
    """The worker's heartbeat, written by a thread (:func:`beating`) every ``every_s`` seconds
    while no lane's current iteration (started at :meth:`iteration`) has run ``limit_s``."""

    every_s: float
    limit_s: float
    _started: dict[str, float] = field(default_factory=dict)

    def iteration(self, lane: str = "") -> None:
        """An iteration of ``lane`` starts (its ``should_stop`` calls it)."""
        self._started[lane] = time.monotonic()

    def idle(self, lane: str = "") -> None:
        """``lane`` ended: it can no longer hang."""
        self._started.pop(lane, None)

    def hung(self) -> str | None:
        """The lane whose current iteration has run past the limit, if one has."""
        now = time.monotonic()
        return next((k for k, t in list(self._started.items()) if now - t > self.limit_s), None)


@contextmanager
def beating(instance: DagsterInstance, run_id: str, heartbeat: Heartbeat) -> Iterator[None]:
    """Write the run's heartbeat every ``heartbeat.every_s`` seconds while the body runs (a
    thread), unless a lane's current iteration is hung.

    A worker beats while its process lives, also while a lane catches up a long backlog on
    Spark (issue 29 item 5: beating only between iterations made a long one look dead). A lane
    past ``heartbeat.limit_s`` (a Spark job or a client call that never returns) stops the beat,
    so a hung worker is still marked failed and replaced (R52; the old and new lanes then race on
    the compare-and-set, rule 1). A write that fails is retried at the next beat; a killed
    process stops beating, which is what the sensor looks for."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat.every_s):
            if heartbeat.hung() is not None:
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


def restart_after(outcome: LaneOutcome) -> float:
    """Seconds before a lane that ended by itself may start again: at once after a failover or
    failback moved its route (the next lane reads the new one), else
    :data:`RESTART_BACKOFF_SECONDS`."""
    moved = outcome.reason.startswith(("failed over", "route changed"))
    return 0.0 if moved and not outcome.failed else RESTART_BACKOFF_SECONDS


class SpecSource:
    """The specs a worker streams, by name and version: read from ``load_specs`` (the pipelines
    file) again whenever the assignment names a version it does not hold."""

    def __init__(self, load_specs: Callable[[], list[PipelineSpec]]) -> None:
        self._load = load_specs
        self._lock = threading.Lock()
        self._specs: dict[str, PipelineSpec] = {}

    def get(self, name: str, version: str) -> PipelineSpec:
        """The spec of ``name`` at ``version``, or :class:`PipelineSpecError` saying why not."""
        with self._lock:
            spec = self._specs.get(name)
            if spec is None or spec_version(spec) != version:
                self._specs = {s.name: s for s in self._load()}
                spec = self._specs.get(name)
        if spec is None or spec_version(spec) != version:
            found = "no such pipeline" if spec is None else f"version {spec_version(spec)}"
            raise PipelineSpecError(
                f"pipeline {name!r}: the stream sensor assigned spec version {version} but the "
                f"pipelines file holds {found}: the file changed since the code location last "
                "loaded it. Reload the code location (Deployment > Reload) so that both agree; "
                "nothing was read or committed"
            )
        return spec


def stream_lane(
    context: OpExecutionContext,
    spec: PipelineSpec,
    resources: tuple[KafkaResource, IcebergCatalogResource, Callable[[], Any]],
    heartbeat: Heartbeat,
    asked_to_stop: Callable[[], str | None],
    on_reported: Callable[[str], None],
) -> StreamSummary:
    """Stream one pipeline on a lane of the worker until ``asked_to_stop`` gives a reason, its
    group check blocks, or a failover or failback moves its route; report each commit.

    Delivery: each iteration is one ``run_pipeline`` (ingestion.pipeline.stream): exactly once
    across kills and restarts; a lost compare-and-set re-plans, never overwrites."""
    kafka, iceberg, spark_session = resources
    catalog = iceberg.load_catalog()
    route = active_route(spec, kafka, iceberg)  # a failover moves it to a replica
    source = route.kafka
    name = spec.name

    def should_stop() -> str | None:
        heartbeat.iteration(name)  # the beat itself is the worker's thread (beating)
        asked = asked_to_stop()
        if asked:
            return asked
        finding = check_group_consistency(read_pipeline_state(spec, kafka, iceberg))
        if finding.blocks:  # the lag sensor then records the check in one run
            context.log.error(f"{name!r} blocked by {GROUP_CHECK.name}: {finding.message}")
            return f"blocked by {GROUP_CHECK.name}"
        now = active_route(spec, kafka, iceberg)
        if now.cluster != route.cluster:  # the worker starts the next lane on the new route
            context.log.warning(f"{name!r} failed over to {now.cluster!r}; stopping its lane")
            return f"failed over from {route.cluster!r} to {now.cluster!r}"
        if now.spec.source_topics != route.spec.source_topics:  # a failback completed
            context.log.warning(f"{name!r} now reads {now.spec.source_topics}; stopping its lane")
            return f"route changed from {route.spec.source_topics} to {now.spec.source_topics}"
        return None

    def on_report(report: RunReport) -> None:
        for note in report.notes:
            context.log.warning(f"{name!r}: {note}")
        for error in (report.dead_letter_error, report.mirror and report.mirror.error):
            if error:
                context.log.warning(f"{name!r}: {error}")
        on_reported(name)
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
        source.get_schema_registry_client(spec.schema_registry_url)
        if avro
        else contextlib.nullcontext()
    ) as registry:
        return stream_pipeline(
            route.spec,
            source.client_config(),
            catalog,
            source.get_cluster_id(),
            commit_interval_seconds(spec),
            should_stop,
            on_report,
            spark=spark_session,
            run_id=context.run_id,
            io_properties=iceberg.io_properties(),
            schema_registry=registry,
            on_conflict=lambda message: context.log.warning(
                f"{name!r}: re-planning after a concurrent commit: {message}"
            ),
            cluster_config=lambda cluster: kafka.for_cluster(cluster).client_config(),
            cluster=route.cluster,
        )


def worker_stop_reason(run: DagsterRun | None) -> str | None:
    """Why the worker must stop: its run is no longer STARTED (the sensor marked it failed, or
    it was terminated), or the sensor asked (the stop tag)."""
    if run is None or run.status != DagsterRunStatus.STARTED:
        return f"run is {run.status.value if run else 'gone'}, no longer STARTED"
    return run.tags.get(STOP_TAG) or None


def build_stream_job(load_specs: Callable[[], list[PipelineSpec]]) -> JobDefinition:
    """The long-lived worker run that streams the pipelines assigned to it (module docstring).

    ``load_specs`` reads the pipelines (the pipelines file; a fixed list in tests): a worker
    picks up a pipeline added or changed after it started from there, once the sensor assigns
    it the version the code location loaded."""

    @op(
        name="stream_pipelines",
        description="Streams the pipelines the stream sensor assigns to this worker, one lane "
        "each, until asked to stop.",
    )
    def _stream(
        context: OpExecutionContext,
        kafka: KafkaResource,
        iceberg: IcebergCatalogResource,
        spark: SparkResource,
    ) -> None:
        """Delivery: each lane iteration is one ``run_pipeline``: exactly once across kills and
        restarts; stopping waits for every lane's iteration to end."""
        instance, run_id = context.instance, context.run_id
        heartbeat = Heartbeat(BEAT_SECONDS, ITERATION_LIMIT_SECONDS)
        specs = SpecSource(load_specs)
        stopping = threading.Event()
        session_lock = threading.Lock()
        reported: set[str] = set()  # lanes that reported since their pipeline's last failure
        reported_lock = threading.Lock()

        def on_report(name: str) -> None:
            with reported_lock:
                reported.add(name)

        def spark_session() -> Any:
            with session_lock:  # lanes ask at once on the first batch: one session
                return spark.spark_session

        def run_lane(name: str, version: str, stop: threading.Event) -> StreamSummary:
            def asked_to_stop() -> str | None:
                if stopping.is_set():
                    return "the worker is stopping"
                if stop.is_set():
                    return "no longer assigned this version (removed, changed, blocked or held)"
                return None

            try:
                spec = specs.get(name, version)
                return stream_lane(
                    context,
                    spec,
                    (kafka, iceberg, spark_session),
                    heartbeat,
                    asked_to_stop,
                    on_report,
                )
            finally:
                heartbeat.idle(name)

        worker = StreamWorker(run_lane, restart_after)
        published: dict[str, str] = {}
        failures: dict[str, str] = {}
        holds: dict[str, str] = {}  # pipeline -> the operator run holding it, as last logged

        def publish(serving: Mapping[str, str]) -> None:
            tags = {SERVING_TAG: dump_tag_map(serving), FAILURES_TAG: dump_tag_map(failures)}
            if tags != published:
                instance.add_run_tags(run_id, tags)
                published.clear()
                published.update(tags)

        with beating(instance, run_id, heartbeat):
            while True:
                run = instance.get_run_by_id(run_id)
                reason = worker_stop_reason(run)
                if reason or run is None:
                    break
                wanted = read_tag_map(run, ASSIGNED_TAG)
                for outcome in worker.reap():
                    report_lane(context, outcome, failures)
                with reported_lock:
                    for name in reported:
                        failures.pop(name, None)
                    reported.clear()
                # An operator action holds a pipeline at once, before the sensor's next tick.
                held = operator_holds(instance, sorted(wanted))
                for name, operator in held.items():
                    if holds.get(name) != operator:
                        context.log.info(f"{name!r}: operator action {operator} in progress")
                holds.clear()
                holds.update(held)
                wanted = {n: v for n, v in wanted.items() if n not in held}
                for name in worker.stop_unwanted(wanted):
                    context.log.info(f"{name!r}: asking its lane to stop (assignment changed)")
                due = worker.due(wanted)
                if due:  # announce, then check the holds (hold_ingestion marks, then reads)
                    publish({**worker.serving(), **{n: wanted[n] for n in due}})
                    late = operator_holds(instance, due)
                    worker.start([n for n in due if n not in late], wanted)
                publish(worker.serving())
                time.sleep(RECONCILE_SECONDS)
            stopping.set()
            for outcome in worker.stop_all():
                report_lane(context, outcome, failures)
            publish({})
        context.log.info(f"stream worker stopped: {reason}")

    @job(
        name=STREAM_JOB,
        description="A shared stream worker: continuous ingestion of the streaming pipelines "
        "assigned to it, each exactly once (platform_assets/streaming).",
        tags={"kind": "stream"},
    )
    def _job() -> None:
        _stream()

    return _job


def report_lane(
    context: OpExecutionContext, outcome: LaneOutcome, failures: dict[str, str]
) -> None:
    """Log how a lane ended; a failure is kept for the sensor's per-pipeline alert."""
    name = outcome.pipeline
    if outcome.failed:
        failures[name] = outcome.error[:500]
        context.log.error(
            f"pipeline {name!r}: its stream lane failed ({outcome.error}); nothing past its last "
            f"commit was committed. The lane restarts in {RESTART_BACKOFF_SECONDS:.0f} s and "
            "re-plans from the table's offsets; the other pipelines are not affected"
        )
        return
    summary = outcome.summary
    done = (
        f"after {summary.commits} commits, {summary.records} records, {summary.conflicts} re-plans"
        if summary is not None
        else ""
    )
    context.log.info(f"pipeline {name!r}: its lane stopped ({outcome.reason}) {done}")
