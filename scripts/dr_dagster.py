"""The DR drill's Dagster path (``scripts/dr_drill.py --via dagster``): the runs a user launches.

Each ingestion run is a real Dagster run of the pipeline's ingestion job (``ingest_<p>_job``:
the ingestion asset and its checks but the audit, ``platform_assets.ingest.jobs``) from the code
location's Definitions (``platform_assets.definitions``, loaded after the drill wrote
``$PLATFORM_CONFIG``, so its resources are built from the drill's configuration: its brokers and
catalog). The operator's failover, failback and completion are runs of the ``failover`` job
(``platform_assets.dr.jobs``). All run on one persistent temp-dir DagsterInstance, as in a
deployment: the failover job counts the ingestion runs in flight there and is refused while one
is active (docs/disaster-recovery.md, "Where producers write after a failover").

Delivery: the job's own. A refused or failed failover run changed nothing (the switch is one
compare-and-set commit) and the operator runs it again; an ingestion run that fails committed
nothing and the next run reads the same offsets.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import DagsterInstance, Definitions, ExecuteInProcessResult

from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.jobs import active_operator_runs
from platform_assets.pipelines import ingest_job_name, table_key

if TYPE_CHECKING:
    from dagster_shared.error import SerializableErrorInfo  # dagster's own error record

FAILOVER_JOB = "failover"  # platform_assets.dr.jobs.build_failover_job
FAILOVER_OP = "failover_pipeline"
# The runs are threads of one process here (a deployment runs each in its own): Dagster's default
# compute-log capture redirects the process's stdout and stderr during each run, so it is off,
# and the console logger says only warnings (the asset's notes) and errors.
NO_CAPTURE = {
    "compute_logs": {
        "module": "dagster._core.storage.noop_compute_log_manager",
        "class": "NoOpComputeLogManager",
    }
}
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


class Refused(Exception):
    """An operator action was refused or failed; nothing was changed, plan again."""


@dataclass
class DagsterPath:
    """The code location's jobs, run in process on one DagsterInstance."""

    defs: Definitions
    instance: DagsterInstance
    spec: PipelineSpec
    failures: dict[str, str] = field(default_factory=dict)  # "job: class" -> first run, traceback
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def open(cls, home: Path, spec: PipelineSpec) -> DagsterPath:
        """Load the code location as Dagster does (it reads ``$PLATFORM_CONFIG`` and the
        pipelines file it names) and a persistent instance under ``home``."""
        from platform_assets.definitions import defs

        home.mkdir(parents=True, exist_ok=True)
        return cls(defs, DagsterInstance.local_temp(str(home), overrides=NO_CAPTURE), spec)

    def ingest(self) -> tuple[str, int | None]:
        """One run of the ingestion job: (its outcome, the snapshot it committed or None; a
        run can fail after its commit, in a check)."""
        held = active_operator_runs(self.instance, self.spec)
        if held:  # what the lag sensor does while an operator job acts on the pipeline
            return "held: operator action in progress", None
        job = self.defs.resolve_job_def(ingest_job_name(self.spec))
        result = job.execute_in_process(
            run_config=QUIET, instance=self.instance, raise_on_error=False
        )
        snapshot_id, table = None, table_key(self.spec)
        for event in result.get_asset_materialization_events():
            if event.asset_key == table:
                metadata = event.step_materialization_data.materialization.metadata
                snapshot_id = int(str(metadata["snapshot_id"].value))
        if result.success:
            return (
                f"dagster run success: {'committed' if snapshot_id else 'nothing new'}",
                snapshot_id,
            )
        cls_name = self.note_failure(job.name, result)
        return (
            f"dagster run failure: {cls_name}{' (after a commit)' * bool(snapshot_id)}",
            snapshot_id,
        )

    def operate(self, config: dict[str, Any]) -> str:
        """One run of the failover job with ``config`` (``pipeline`` and ``apply`` are set
        here); its run id. Raises :class:`Refused` with the run's error when it failed."""
        job = self.defs.resolve_job_def(FAILOVER_JOB)
        op_config = {"pipeline": self.spec.name, "apply": True} | config
        result = job.execute_in_process(
            run_config={"ops": {FAILOVER_OP: {"config": op_config}}} | QUIET,
            instance=self.instance,
            raise_on_error=False,
        )
        if result.success:
            return result.run_id
        cls_name = self.note_failure(job.name, result)
        raise Refused(f"run {result.run_id}: {cls_name}: {error_message(failure_error(result))}")

    def note_failure(self, job: str, result: ExecuteInProcessResult) -> str:
        """The error class of the run's failure event; the first run per job and class is kept
        with its traceback (:meth:`describe_failures`)."""
        error = failure_error(result)
        cls_name = (error.cls_name if error else None) or "unknown"
        text = error.to_string() if error else "no error recorded"
        with self.lock:
            self.failures.setdefault(f"{job}: {cls_name}", f"run {result.run_id}\n{text}")
        return cls_name

    def describe_failures(self) -> list[str]:
        """Per job and error class, the first failed run's id and traceback."""
        return [f"{key}; first {text}" for key, text in sorted(self.failures.items())]


def failure_error(result: ExecuteInProcessResult) -> SerializableErrorInfo | None:
    """The op's own exception in the run's failure event: its first failed step's error, which
    Dagster wraps (``DagsterExecutionStepExecutionError``) unless the op raised a ``Failure``."""
    data = result.get_run_failure_event().event_specific_data
    step = getattr(data, "first_step_failure_event", None)  # JobFailureData, not exported
    failed = [step] if step is not None else list(result.get_step_failure_events())
    error: SerializableErrorInfo | None = (
        failed[0].step_failure_data.error if failed else getattr(data, "error", None)
    )
    if error is not None and error.cls_name == "DagsterExecutionStepExecutionError":
        return error.cause or error
    return error


def error_message(error: SerializableErrorInfo | None) -> str:
    """The error's own message, without the qualified class name Dagster puts first."""
    if error is None:
        return "no error recorded"
    text = error.message.strip()
    head, _, rest = text.partition(": ")
    return rest if head.endswith(error.cls_name or "?") else text


def job_config(args: list[str]) -> dict[str, Any]:
    """The failover job's config for the ``platform`` command ``args`` (the job runs the same
    code: docs/disaster-recovery.md, "Failing over").

    Example:
        >>> job_config(["failover", "orders", "--to", "dr", "--source-lost", "--reason", "x"])
        {'complete': False, 'source_lost': True, 'to': 'dr', 'reason': 'x'}
        >>> job_config(["complete-failback", "orders", "--reason", "drained"])
        {'complete': True, 'source_lost': False, 'reason': 'drained'}
    """
    options = [arg for arg in args[2:] if arg not in ("--source-lost", "--apply")]
    config: dict[str, Any] = {
        "complete": args[0] == "complete-failback",
        "source_lost": "--source-lost" in args,
    }
    return config | {
        k.removeprefix("--").replace("-", "_"): v
        for k, v in zip(options[::2], options[1::2], strict=True)
    }
