"""Jobs: ingest one pipeline / all pipelines, observe topics, run all checks."""

import datetime as dt
from typing import TYPE_CHECKING, TypeAlias

from dagster import (
    AssetCheckKey,
    AssetSelection,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    JobDefinition,
    OpExecutionContext,
    RunsFilter,
    define_asset_job,
    in_process_executor,
    job,
    op,
)

from ingestion.health.checks import AUDIT_CHECK, GROUP_CHECK, replica_check_def
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.assets import observe_topic
from platform_assets.ingest.checks import pipeline_check_keys
from platform_assets.ingest.liveness import active_runs, clear_dead_runs
from platform_assets.pipelines import (
    INGEST_ALL_JOB,
    ingest_job_name,
    ingestion_keys,
    table_key,
    topic_asset_keys,
)
from resources.kafka import KafkaResource

if TYPE_CHECKING:
    # define_asset_job's return type is not exported by dagster 1.13; used for annotations only.
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition,
    )

AssetJob: TypeAlias = "UnresolvedAssetJobDefinition"


# Queued or in progress, as Dagster counts them: a CANCELING run (its termination requested,
# its process not ended yet: ``make dev`` stopping, Terminate in the UI) may still commit, so
# it holds what a STARTED run holds (a stream worker's shard, an operator's hold, an action's
# wait) until it ended, or until its process is provably gone (``liveness.RUNNING_STATUSES``).
ACTIVE_RUN_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


OPERATOR_TAG = "platform/operator-action"  # an operator job's run: the pipeline it acts on


def count_active_runs(instance: DagsterInstance, job_name: str) -> int:
    """Runs of ``job_name`` queued or in progress that may be alive.

    A run whose process is provably gone (killed on this machine:
    ``platform_assets.ingest.liveness``) is marked failed here instead, as Dagster's run
    monitoring would if it could see a dead worker of the default run launcher: otherwise it
    stays STARTED for ever, the sensors that ask launch nothing more for the pipeline, and it
    holds its concurrency slot. A run that may be alive (another host, no tag) counts.
    """
    runs = active_runs(instance, [job_name], list(ACTIVE_RUN_STATUSES))
    clear_dead_runs(instance, [run for run in runs if run.dead], by="a sensor of the platform")
    return sum(1 for run in runs if not run.dead)


OPERATOR_HOLD_LIMIT = dt.timedelta(minutes=20)  # above the wait (2 min) plus a failback's plan


def operator_holds(instance: DagsterInstance, pipelines: list[str]) -> dict[str, str]:
    """The pipelines of ``pipelines`` that an operator job's run (reset, migrate, failover) acts
    on now, each with the id of one such run: no ingestion run of them is launched, and no
    stream lane started, while it lasts (``platform_assets.operations.actions.hold_ingestion``).

    Only runs created within ``OPERATOR_HOLD_LIMIT`` hold: a run whose process died stays
    STARTED for ever without Dagster's run monitoring, and must not stop ingestion for good
    (past the limit the compare-and-set alone decides, as without the hold). One query,
    however many pipelines."""
    if not pipelines:
        return {}
    return {run.tags[OPERATOR_TAG]: run.run_id for run in operator_runs(instance, pipelines)}


def operator_action_in_progress(instance: DagsterInstance, spec: PipelineSpec) -> str | None:
    """Why maintenance must give way now: an operator action holds ``spec`` (its run named);
    None otherwise (:func:`operator_holds`)."""
    acting = operator_holds(instance, [spec.name]).get(spec.name)
    return f"operator action in progress (run {acting})" if acting else None


def active_operator_runs(instance: DagsterInstance, spec: PipelineSpec) -> list[str]:
    """Ids of the operator jobs' runs acting on ``spec`` now (see :func:`operator_holds`)."""
    return [run.run_id for run in operator_runs(instance, [spec.name])]


def operator_runs(instance: DagsterInstance, pipelines: list[str]) -> list[DagsterRun]:
    """The operator jobs' runs in progress, created within ``OPERATOR_HOLD_LIMIT``, acting on
    any of ``pipelines`` (one query)."""
    since = dt.datetime.now(dt.UTC) - OPERATOR_HOLD_LIMIT
    return list(
        instance.get_runs(
            RunsFilter(
                tags={OPERATOR_TAG: list(pipelines)},
                statuses=ACTIVE_RUN_STATUSES,
                created_after=since,
            )
        )
    )


def ingestion_selection(spec: PipelineSpec) -> AssetSelection:
    """What one ingestion run materializes and evaluates: the pipeline's assets and their
    checks, but the exactly-once audit and the replica checks.

    The other checks read metadata only (snapshot summaries, offsets). The audit recounts
    every new commit's ranges in Kafka and reads its files, as costly as the ingestion itself:
    ``run_checks`` evaluates it on its schedule, from its cursor, so every commit is still
    audited once (R47), off the path from produce to queryable. So are the replica checks:
    they read MirrorMaker 2's topics on both clusters, and while a failover's source is down
    each waited out its timeout in every run (11 s runs instead of 1.5 s, DR drill through
    Dagster runs).
    """
    return AssetSelection.assets(*ingestion_keys(spec)) - AssetSelection.checks(
        *off_path_checks(spec)
    )


def off_path_checks(spec: PipelineSpec) -> list[AssetCheckKey]:
    """The checks an ingestion run leaves to ``run_checks`` (:func:`ingestion_selection`)."""
    table = table_key(spec)
    return [AssetCheckKey(table, AUDIT_CHECK.name)] + [
        AssetCheckKey(table, replica_check_def(replica).name) for replica in spec.replicas
    ]


def ingestion_check_keys(spec: PipelineSpec) -> list[AssetCheckKey]:
    """The checks one ingestion run evaluates (:func:`ingestion_selection`)."""
    off_path = off_path_checks(spec)
    return [key for key in pipeline_check_keys(spec) if key not in off_path]


def build_ingest_job(spec: PipelineSpec) -> AssetJob:
    """Ingest one pipeline: its table, commit log and quarantine, with their checks but the
    audit (:func:`ingestion_selection`).

    Its steps run in the run's own process (``in_process_executor``): they run one after
    the other anyway (the checks follow the commit), and a process per step would import
    the code location again for each (seconds of a small run's fixed cost).
    """
    return define_asset_job(
        ingest_job_name(spec),
        selection=ingestion_selection(spec),
        executor_def=in_process_executor,
        description=f"Ingest pipeline {spec.name!r} ({spec.table}) exactly once.",
        tags={"pipeline": spec.name},
    )


def build_ingest_all_job(specs: list[PipelineSpec]) -> AssetJob:
    """Ingest every pipeline, or those a run selects (the fallback schedules' runs), one after
    the other in the run's own process (each still one run at a time through its pool): a
    process per step would import the code location again for each, and a run killed with its
    process can then be told dead like a pipeline's own run (``platform_assets.ingest.liveness``).
    One pipeline's failing step does not stop the others'."""
    selection: AssetSelection = AssetSelection.assets()
    for spec in specs:
        selection = selection | ingestion_selection(spec)
    return define_asset_job(
        INGEST_ALL_JOB,
        selection=selection,
        executor_def=in_process_executor,
        description="Ingest every pipeline (or the selected ones) exactly once.",
    )


def build_run_checks_job(specs: list[PipelineSpec]) -> AssetJob:
    """Evaluate every table check without ingesting, but the blocking group-id check.

    That one runs first in every ingestion run, and each pipeline's lag sensor evaluates it on
    every tick and requests one run to record it when it changes; here, a failing blocking
    check would fail this run every five minutes (Dagster fails a step whose blocking check
    fails) for a cause already reported.
    """
    tables = [table_key(spec) for spec in specs]
    blocking = [AssetCheckKey(table, GROUP_CHECK.name) for table in tables]
    return define_asset_job(
        "run_checks",
        selection=AssetSelection.checks_for_assets(*tables) - AssetSelection.checks(*blocking),
    )


def build_observe_topics_job(specs: list[PipelineSpec]) -> JobDefinition:
    """Observe every pipeline's topics (reads offsets, commits nothing)."""

    @op(name="observe_topic_offsets")
    def _observe(context: OpExecutionContext, kafka: KafkaResource) -> None:
        """Each topic on its own: a missing topic is a flagged observation of that topic (named,
        with the pipeline that reads it) and a warning; the others are observed as usual."""
        for spec in specs:
            for key in topic_asset_keys(spec):
                observation = observe_topic(kafka, spec, key)
                problem = observation.metadata.get("problem")
                if problem is not None:
                    context.log.warning(f"{key.to_user_string()}: {problem.value}")
                context.log_event(observation)

    @job(name="observe_topics", description="Observe partitions and end offsets of every topic.")
    def _job() -> None:
        _observe()

    return _job
