"""The failover job: switch a pipeline to a MirrorMaker 2 replica or back, or end a failback,
on the same code as the CLI (``platform failover`` / ``platform complete-failback``).

Built only for pipelines that declare ``replicas:`` (``platform_assets.definitions``).
Delivery: the switch is an operator action committed by compare-and-set
(``ingestion.dr.switch``); a dry run (the default) commits nothing.
"""

from dagster import (
    Config,
    Failure,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    job,
    op,
)

from ingestion.exceptions import IngestionError
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.dr.failover import complete_failback, failover_pipeline
from platform_assets.operations.jobs import hold_for_action, pick_pipeline
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


class FailoverConfig(Config):
    """Switch a pipeline to a replica (or ``primary``: failback); a dry run unless ``apply``.
    With ``complete``, end a failback's route once its reverse copies are drained instead
    (``to`` unset or ``primary``)."""

    pipeline: str
    to: str | None = None
    apply: bool = False
    reason: str = ""
    complete: bool = False
    # The cluster the pipeline reads is lost: MM2 copies nothing more from it (CLI
    # --source-lost; with to=primary: fail back from a lost replica, docs/reliability.md R55).
    source_lost: bool = False
    # Seconds to wait for the pipeline's ingestion runs in progress to end (its lag sensor
    # launches none meanwhile); the action is refused if one is still active after them.
    wait_for_runs_seconds: float = 120.0


def build_failover_job(specs: list[PipelineSpec]) -> JobDefinition:
    """The ``failover`` job for ``specs`` (a pipeline without replicas is refused by name)."""

    @op(name="failover_pipeline")
    def _failover(
        context: OpExecutionContext,
        config: FailoverConfig,
        kafka: KafkaResource,
        iceberg: IcebergCatalogResource,
    ) -> None:
        spec = pick_pipeline(specs, config.pipeline)
        if config.apply and not config.reason:
            raise Failure("a failover needs a reason (config: reason)")
        if config.complete and config.to not in (None, "primary"):
            raise Failure(f"complete ends a failback to primary, not a failover to {config.to!r}")
        if not config.complete and config.to is None:
            raise Failure("a failover needs a target (config: to), or complete: true")
        active = hold_for_action(context, spec, config.wait_for_runs_seconds, config.apply)
        try:
            if config.complete:
                lines = complete_failback(
                    spec,
                    kafka,
                    iceberg,
                    dry_run=not config.apply,
                    requested_by=f"dagster run {context.run_id}",
                    reason=config.reason,
                    active_runs=active,
                )
            else:
                assert config.to is not None
                lines = failover_pipeline(
                    spec,
                    kafka,
                    iceberg,
                    config.to,
                    dry_run=not config.apply,
                    requested_by=f"dagster run {context.run_id}",
                    reason=config.reason,
                    active_runs=active,
                    source_lost=config.source_lost,
                )
        except IngestionError as exc:
            raise Failure(str(exc)) from None
        context.add_output_metadata({"plan": MetadataValue.md("\n".join(f"- {x}" for x in lines))})

    @job(
        name="failover",
        description="Switch a pipeline to a replica or back, or end a failback (dry run default).",
    )
    def failover_job() -> None:
        _failover()

    return failover_job
