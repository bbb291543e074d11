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
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import (
    AssetMaterialization,
    DagsterExecutionInterruptedError,
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
from ingestion.pipeline.execute import pipeline_job_tag
from ingestion.pipeline.run import RunReport
from ingestion.pipeline.stream import StreamSummary, stream_pipeline
from ingestion.pipeline.worker import LaneOutcome, StreamWorker
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.jobs import ACTIVE_RUN_STATUSES, operator_holds
from platform_assets.ingest.liveness import RUNNING_STATUSES
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
HUNG_TAG = "stream/hung"  # JSON {pipeline: since}: lanes whose iteration ran past the limit

RECONCILE_SECONDS = 2.0  # how often a worker reads its assignment and reaps its lanes
BEAT_SECONDS = 15.0
STALE_AFTER_SECONDS = 60.0  # a worker silent this long is dead (its process was killed)
ITERATION_LIMIT_SECONDS = 900.0
"""A lane iteration running longer than this is hung: the worker cancels its Spark jobs and
names it (``stream/hung``); past twice this the worker stops beating, so the sensor marks it
failed and starts another (R52). A stream iteration reads at most 1M offsets by default
(``ingestion.pipeline.stream.STREAM_MAX_RECORDS_PER_ITERATION``), well within it."""
STOP_TIMEOUT_SECONDS = 120.0
"""A stopping worker waits this long for its lanes to end between commits; a lane still running
then dies with the process (a crash before its commit: nothing lost or doubled)."""
LANE_CHECK_SECONDS = 30.0
"""A lane reads its pipeline's state for the blocking group check, and its route, before its
first iteration, after any re-plan (a lost compare-and-set, a refused route) and otherwise at
most this often: reading them (new Kafka clients, two table loads) cost more than the
iteration's own plan. Between two reads nothing is committed wrong: a spec change restarts the
lane (and so reads first), an operator action holds it, and every plan refuses a moved route
(``RouteClusterError``), a retired group or a table whose offsets are under another group by
itself. A foreign consumer joining the Kafka group is found within this period; the table's
offsets, not the group's, decide what is read, so it cannot make a commit lose or repeat a
record meanwhile."""
RESTART_BACKOFF_SECONDS = 30.0
"""A lane that failed, or stopped by itself (a blocked check), restarts no sooner: a failure that
repeats does not become a storm, and the lag sensor has time to record a blocking check."""


def spec_version(spec: PipelineSpec) -> str:
    """A digest of the spec: a lane runs one version, a changed spec restarts only its lane."""
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:12]


CODE_PACKAGES = ("ingestion", "platform_assets", "resources")


def code_generation(workers: int) -> str:
    """Which code and configuration a worker runs: a digest of the packages' Python files, of
    the platform configuration file (``$PLATFORM_CONFIG``: clusters, catalog, Spark, secrets'
    references) and of the worker count.

    A reload that changes only the pipelines file keeps it (the workers pick the change up
    lane by lane); new code, another configuration or another number of workers restarts the
    workers."""
    from resources.config import config_path

    digest = hashlib.sha256()
    config = config_path()
    if config is not None and config.is_file():
        digest.update(config.read_bytes())
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
    serving it (a live lane; a CANCELING one too, until its lanes stopped), or a queued one
    assigned it."""
    runs = []
    for run in active_workers(instance):
        started = run.status in RUNNING_STATUSES
        if spec.name in read_tag_map(run, SERVING_TAG if started else ASSIGNED_TAG):
            runs.append(run)
    return runs


def is_stale(
    run: DagsterRun, now: float, started_at: float | None, after_s: float = STALE_AFTER_SECONDS
) -> bool:
    """Whether a started (or CANCELING) run stopped beating for ``after_s`` (no heartbeat:
    judged from its start time)."""
    beat = run.tags.get(HEARTBEAT_TAG)
    last = float(beat) if beat else started_at
    return last is not None and now - last > after_s


@dataclass
class Heartbeat:
    """Which lane iterates since when (:meth:`iteration`, :meth:`idle`): :func:`beating` reads
    it to find a hung lane."""

    every_s: float
    limit_s: float
    _started: dict[str, float] = field(default_factory=dict)

    def iteration(self, lane: str = "") -> None:
        """An iteration of ``lane`` starts (its ``should_stop`` calls it; so does its set-up)."""
        self._started[lane] = time.monotonic()

    def idle(self, lane: str = "") -> None:
        """``lane`` ended: it can no longer hang."""
        self._started.pop(lane, None)

    def hung(self, factor: float = 1.0) -> str | None:
        """A lane whose current iteration has run past ``factor`` x the limit, if one has."""
        now, limit = time.monotonic(), factor * self.limit_s
        return next((k for k, t in list(self._started.items()) if now - t > limit), None)


class WorkerTags:
    """The worker's own run tags, written under one lock: Dagster's ``add_run_tags`` reads the
    whole run, merges and writes it back, so two writers of one process could undo each other.
    Every beat rewrites what the worker publishes (``stream/serving``, ``stream/failures``,
    ``stream/hung``), so a value a concurrent writer (the sensor) overwrote with an older one is
    repaired within a beat."""

    def __init__(self, instance: DagsterInstance, run_id: str) -> None:
        self._instance, self._run_id = instance, run_id
        self._lock = threading.Lock()
        self._published: dict[str, str] = {}
        self._current = {SERVING_TAG: "{}", FAILURES_TAG: "{}", HUNG_TAG: "{}"}

    def publish(
        self,
        serving: Mapping[str, str] | None = None,
        failures: Mapping[str, str] | None = None,
        hung: Mapping[str, str] | None = None,
    ) -> None:
        """Write the values given now if they changed."""
        with self._lock:
            for tag, value in ((SERVING_TAG, serving), (FAILURES_TAG, failures), (HUNG_TAG, hung)):
                if value is not None:
                    self._current[tag] = dump_tag_map(value)
            if self._current != self._published:
                self._instance.add_run_tags(self._run_id, dict(self._current))
                self._published = dict(self._current)

    def beat(self) -> None:
        """The heartbeat, with every published value written again."""
        with self._lock:
            self._instance.add_run_tags(
                self._run_id, {HEARTBEAT_TAG: str(int(time.time())), **self._current}
            )
            self._published = dict(self._current)


@contextmanager
def beating(
    tags: WorkerTags, heartbeat: Heartbeat, on_hung: Callable[[str], None] = lambda lane: None
) -> Iterator[None]:
    """Beat every ``heartbeat.every_s`` seconds (a thread) while the body runs.

    A worker beats while its process lives, also while a lane catches up a backlog (R52:
    beating only between iterations made a long one look dead). A lane whose iteration
    runs past ``heartbeat.limit_s`` is hung: ``on_hung`` is called once (the worker cancels its
    Spark jobs and names it in ``stream/hung``), and the other lanes go on. Only a lane hung past
    twice the limit (a call that ignores the cancel) stops the beat, so the sensor marks the
    worker failed and replaces it (R52; the old and new lanes then race on the
    compare-and-set, rule 1). A write that fails is retried at the next beat; a killed process
    stops beating, which is what the sensor looks for."""
    stop = threading.Event()
    reported: set[str] = set()

    def beat() -> None:
        while not stop.wait(heartbeat.every_s):
            lane = heartbeat.hung()
            if lane is not None and lane not in reported:
                reported.add(lane)
                with contextlib.suppress(Exception):
                    on_hung(lane)
            if heartbeat.hung(factor=2.0) is not None:
                continue
            with contextlib.suppress(Exception):  # the run storage hiccuped: the next beat
                tags.beat()

    thread = threading.Thread(target=beat, name="stream-worker-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(heartbeat.every_s + 10)


# A lane failure whose message has one of these lost the Spark session itself (a Connect server
# restarted, a classic JVM gone): the worker drops its session, the next lane starts a new one.
SESSION_ERRORS = (
    "INVALID_HANDLE",
    "SESSION_CLOSED",
    "SESSION_CHANGED",
    "NO_ACTIVE_SESSION",
    "StatusCode.UNAVAILABLE",
    "Py4JNetworkError",
    "SparkContext was shut down",
    "stopped SparkContext",
)


class SharedSession:
    """The worker's one Spark session, created on a lane's first batch (under a lock: lanes ask
    at once), dropped when a lane failed because the session itself was lost."""

    def __init__(self, spark: SparkResource) -> None:
        self._spark = spark
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The session (created on first use)."""
        with self._lock:
            return self._spark.spark_session

    def drop_if_lost(self, error: str) -> bool:
        """Drop the session when ``error`` says it was lost; return whether it was."""
        if not any(marker in error for marker in SESSION_ERRORS):
            return False
        with self._lock, contextlib.suppress(Exception):
            self._spark.stop_session()
        return True

    def interrupt(self, pipeline: str) -> None:
        """Cancel the Spark jobs of ``pipeline``'s batches (a hung lane)."""
        with contextlib.suppress(Exception):
            self.get().interruptTag(pipeline_job_tag(pipeline))


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
    emit: Callable[[AssetMaterialization], None],
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

    checked = [float("-inf")]  # when the group check and the route were last read

    def should_stop() -> str | None:
        heartbeat.iteration(name)  # the beat itself is the worker's thread (beating)
        asked = asked_to_stop()
        if asked:
            return asked
        if time.monotonic() - checked[0] < LANE_CHECK_SECONDS:
            return None  # each plan refuses a moved route or a foreign group by itself
        checked[0] = time.monotonic()
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
        emit(AssetMaterialization(asset_key=table_key(spec), metadata=run_metadata(report)))
        if spec.errors_tolerance == "all" and report.quarantined:  # R10: no rows, no event
            emit(
                AssetMaterialization(
                    asset_key=quarantine_key(spec),
                    metadata={
                        "quarantined_this_run": MetadataValue.int(report.quarantined),
                        "table": MetadataValue.text(spec.quarantine_table),
                    },
                )
            )
        commits = commits_of(catalog.load_table(spec.table), spec.consumer_group_id)
        emit(
            AssetMaterialization(
                asset_key=commit_state_key(spec),
                metadata=commit_log_metadata(commits, spec.consumer_group_id),
            )
        )

    def on_conflict(message: str) -> None:
        # Another writer committed first, or a switch moved the route: read the group check
        # and the route again before the next plan.
        checked[0] = float("-inf")
        context.log.warning(f"{name!r}: re-planning after a concurrent commit: {message}")

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
            on_conflict=on_conflict,
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
        out={},
        description="Streams the pipelines the stream sensor assigns to this worker, one lane "
        "each, until asked to stop.",
    )
    def _stream(
        context: OpExecutionContext,
        kafka: KafkaResource,
        iceberg: IcebergCatalogResource,
        spark: SparkResource,
    ) -> Iterator[AssetMaterialization]:
        """Delivery: each lane iteration is one ``run_pipeline``: exactly once across kills and
        restarts; stopping waits for every lane's iteration to end (up to
        ``STOP_TIMEOUT_SECONDS``). The lanes' materializations are yielded by this loop, so
        the op keeps none in memory however long it runs."""
        instance, run_id = context.instance, context.run_id
        heartbeat = Heartbeat(BEAT_SECONDS, ITERATION_LIMIT_SECONDS)
        specs, session = SpecSource(load_specs), SharedSession(spark)
        tags = WorkerTags(instance, run_id)
        stopping = threading.Event()
        events: queue.SimpleQueue[AssetMaterialization] = queue.SimpleQueue()
        reported: set[str] = set()  # lanes that reported since their pipeline's last failure
        reported_lock = threading.Lock()
        failures: dict[str, str] = {}
        hung: dict[str, str] = {}
        holds: dict[str, str] = {}  # pipeline -> the operator run holding it, as last logged

        def on_report(name: str) -> None:
            with reported_lock:
                reported.add(name)

        def on_hung(name: str) -> None:
            context.log.error(
                f"pipeline {name!r}: its lane's iteration has run over "
                f"{ITERATION_LIMIT_SECONDS:.0f} s: cancelling its Spark jobs (the lane fails and "
                "restarts; the other pipelines are not affected). Past twice that the worker "
                "stops beating and is replaced"
            )
            hung[name] = str(int(time.time()))
            session.interrupt(name)

        def run_lane(name: str, version: str, stop: threading.Event) -> StreamSummary:
            def asked_to_stop() -> str | None:
                if stopping.is_set():
                    return "the worker is stopping"
                if stop.is_set():
                    return "no longer assigned this version (removed, changed, blocked or held)"
                return None

            heartbeat.iteration(name)  # the set-up counts: a hang there is found too
            try:
                return stream_lane(
                    context,
                    specs.get(name, version),
                    (kafka, iceberg, session.get),
                    heartbeat,
                    asked_to_stop,
                    on_report,
                    events.put,
                )
            finally:
                heartbeat.idle(name)

        worker = StreamWorker(run_lane, restart_after)
        reason, errors = "the op ended", 0
        with beating(tags, heartbeat, on_hung):
            try:
                while True:
                    try:
                        run = instance.get_run_by_id(run_id)
                        stop_reason = worker_stop_reason(run)
                        if stop_reason or run is None:
                            reason = stop_reason or "the run is gone"
                            break
                        for outcome in worker.reap():
                            hung.pop(outcome.pipeline, None)
                            report_lane(context, outcome, failures)
                            if outcome.failed and session.drop_if_lost(outcome.error):
                                context.log.warning("the Spark session was lost: starting anew")
                        with reported_lock:
                            for name in reported:
                                failures.pop(name, None)
                            reported.clear()
                        reconcile(context, worker, read_tag_map(run, ASSIGNED_TAG), holds, tags)
                        tags.publish(worker.serving(), failures, hung)
                        errors = 0
                    except Exception as exc:  # the run storage hiccuped: the lanes go on
                        errors += 1
                        if errors >= MAX_RECONCILE_ERRORS:
                            raise
                        context.log.warning(f"stream worker: reconcile failed ({exc}); retrying")
                    while not events.empty():
                        yield events.get()
                    time.sleep(RECONCILE_SECONDS)
            finally:
                stopping.set()
                for outcome in worker.stop_all(STOP_TIMEOUT_SECONDS):
                    report_lane(context, outcome, failures)
                left = sorted(worker.serving())
                if left:
                    context.log.warning(
                        f"lanes of {left} did not end within {STOP_TIMEOUT_SECONDS:.0f} s; they "
                        "end with the process (a crash before their commit: nothing lost or "
                        "doubled)"
                    )
                with contextlib.suppress(Exception):
                    tags.publish({}, failures, {})
            while not events.empty():
                yield events.get()
        context.log.info(f"stream worker stopped: {reason}")
        run = instance.get_run_by_id(run_id)
        if run is not None and run.status == DagsterRunStatus.CANCELING:
            # Terminated (the UI, make dev's Ctrl-C): its lanes stopped cleanly first, and the
            # run ends canceled, as an interrupted one does, not as a success.
            raise DagsterExecutionInterruptedError(f"stream worker terminated: {reason}")

    @job(
        name=STREAM_JOB,
        description="A shared stream worker: continuous ingestion of the streaming pipelines "
        "assigned to it, each exactly once (platform_assets/streaming).",
        tags={"kind": "stream"},
    )
    def _job() -> None:
        _stream()

    return _job


MAX_RECONCILE_ERRORS = 5  # in a row: the worker fails (and is restarted) instead of spinning


def reconcile(
    context: OpExecutionContext,
    worker: StreamWorker,
    wanted: dict[str, str],
    holds: dict[str, str],
    tags: WorkerTags,
) -> None:
    """Bring the worker's lanes to ``wanted`` minus the pipelines an operator action holds.

    A held pipeline's lane is asked to stop at once (before the sensor's next tick). A lane is
    announced in ``stream/serving`` before the holds are read again and it starts; the operator
    (``hold_ingestion``) marks its run before it reads ``stream/serving``: either it sees the
    lane and waits, or the worker sees the mark."""
    instance = context.instance
    held = operator_holds(instance, sorted(wanted))
    for name, operator in held.items():
        if holds.get(name) != operator:
            context.log.info(f"{name!r}: operator action {operator} in progress")
    holds.clear()
    holds.update(held)
    wanted = {n: v for n, v in wanted.items() if n not in held}
    for name in worker.stop_unwanted(wanted):
        context.log.info(f"{name!r}: asking its lane to stop (no longer assigned, or held)")
    due = worker.due(wanted)
    if due:
        tags.publish({**worker.serving(), **{n: wanted[n] for n in due}})
        late = operator_holds(instance, due)
        worker.start([n for n in due if n not in late], wanted)


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
