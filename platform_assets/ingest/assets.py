"""Assets built from each pipeline spec: its Kafka topics (external, observed), and the Iceberg
table, commit log and quarantine table that one ingestion run materializes."""

from collections.abc import Iterator
from contextlib import nullcontext

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetsDefinition,
    AssetSpec,
    Failure,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)

from ingestion.exceptions import TopicNotFoundError
from ingestion.health.checks import GROUP_CHECK, check_group_consistency
from ingestion.health.state import commits_of
from ingestion.kafka.topics import describe_topic, list_matching_topics, read_newest_timestamp_ms
from ingestion.pipeline.run import run_pipeline
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.checks import check_spec, to_result
from platform_assets.ingest.liveness import record_run_process
from platform_assets.ingest.metadata import commit_log_metadata, run_metadata, topic_metadata
from platform_assets.pipelines import (
    INGEST_ALL_JOB,
    commit_state_key,
    ingest_job_name,
    quarantine_key,
    table_key,
    topic_asset_keys,
)
from platform_assets.route import active_route
from platform_assets.state import read_pipeline_state
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource


def build_topic_spec(spec: PipelineSpec, key: AssetKey) -> AssetSpec:
    """The external asset of one topic (or of a pattern pipeline's topics)."""
    source = f"pattern {spec.topic_pattern!r}" if spec.topic_pattern else f"topic {key.path[-1]!r}"
    return AssetSpec(
        key=key,
        group_name="kafka",
        kinds={"kafka"},
        description=f"Kafka {source}, read by pipeline {spec.name!r}. Observed by observe_topics.",
        metadata={"pipeline": spec.name, "consumer_group_id": spec.consumer_group_id},
    )


def observe_topic(kafka: KafkaResource, spec: PipelineSpec, key: AssetKey) -> AssetObservation:
    """Read the topic's partitions, end offsets and newest record time; join no group.

    A topic that does not exist does not fail the observation: it is named in its ``problem``
    metadata (the topics that exist are observed as usual).
    """
    admin = kafka.get_admin_client()
    topics = (
        list_matching_topics(admin, spec.topic_pattern) if spec.topic_pattern else [key.path[-1]]
    )
    consumer = kafka.get_consumer()
    states, missing = [], []
    try:
        for topic in topics:
            try:
                states.append(describe_topic(admin, consumer, topic))
            except TopicNotFoundError as exc:
                missing.append(str(exc))
        newest = [read_newest_timestamp_ms(consumer, state) for state in states]
    finally:
        consumer.close()
    newest_ms = max((ms for ms in newest if ms is not None), default=None)
    metadata = topic_metadata(states, newest_ms)
    if missing:
        metadata["problem"] = MetadataValue.text(
            f"not found: {'; '.join(missing)}. Pipeline {spec.name!r} reads nothing from it "
            "until it exists: create the topic, or correct the pipeline's topic."
        )
    return AssetObservation(asset_key=key, metadata=metadata)


def build_ingestion_asset(spec: PipelineSpec) -> AssetsDefinition:
    """The multi-asset one ingestion run materializes, with the blocking group-id check.

    The group check runs first, inside the run: when it fails with ERROR the run stops before
    reading anything (ingestion is blocked), and the check result says why and how to fix it.

    The table asset carries no Dagster ``FreshnessPolicy``: its freshness is the
    ``commit_freshness`` check (stale only while records wait longer than the bound). Dagster
    1.13 judges a time-window (or cron) policy by the asset's last *materialization* alone
    (``TimeWindowFreshnessPolicyEvaluator``; observations and checks do not count), and a run
    that ingests nothing reports none (R10: downstream dbt is not rebuilt), so an idle topic's
    table would turn stale in the UI while nothing waits. Materializing on idle runs to feed
    the policy would rebuild dbt for nothing; the check already shows on the asset, runs every
    five minutes and alerts through ``check_alerts``.
    """
    topics = topic_asset_keys(spec)
    sources = ", ".join(k.path[-1] for k in topics)
    table = AssetSpec(
        table_key(spec),
        deps=topics,
        group_name=spec.name,
        kinds={"iceberg", "spark"},
        skippable=True,  # a run that commits nothing reports no materialization (R10)
        description=f"Iceberg table {spec.table}: every record of {sources} exactly once, with "
        f"its Kafka coordinates (group {spec.consumer_group_id!r}).",
        metadata={"table": spec.table, "pipeline": spec.name},
    )
    specs = [
        table,
        AssetSpec(
            commit_state_key(spec),
            deps=[table.key],
            group_name=spec.name,
            kinds={"iceberg"},
            skippable=True,
            description=(
                "The coordinator's commit log: one row per commit (snapshot, offsets, counts)."
            ),
        ),
    ]
    if spec.errors_tolerance == "all":
        specs.append(
            AssetSpec(
                quarantine_key(spec),
                deps=topics,
                group_name=spec.name,
                kinds={"iceberg"},
                skippable=True,
                description=f"Records of {spec.name!r} that could not be decoded, with the error.",
            )
        )
    check = check_spec(spec, GROUP_CHECK, blocking=True)

    @multi_asset(
        name=f"ingest_{spec.name}",
        specs=specs,
        check_specs=[check],
        can_subset=True,
        pool=f"ingest_{spec.name}",
    )
    def _ingest(
        context: AssetExecutionContext,
        kafka: KafkaResource,
        iceberg: IcebergCatalogResource,
        spark: SparkResource,
    ) -> Iterator[MaterializeResult | AssetCheckResult]:
        # Where this run's process runs: an operator action can then tell it is dead once
        # it was killed (platform_assets.ingest.liveness). The pipeline's own job and
        # ingest_all run their steps in the run's process (in_process_executor); a job of
        # another executor runs it in a child, which may end while the run goes on (such a
        # run stays untagged and always counts as alive).
        if context.run.job_name in (ingest_job_name(spec), INGEST_ALL_JOB):
            record_run_process(context.instance, context.run.run_id)
        finding = check_group_consistency(read_pipeline_state(spec, kafka, iceberg))
        if context.selected_asset_check_keys:
            yield to_result(spec, GROUP_CHECK.name, finding)
        if table.key in context.selected_asset_keys:
            if finding.blocks:
                # The lag sensor and the fallback schedule launch no run while this check
                # fails; this run was queued before, or launched by hand. check_alerts reports
                # the check; run_failure_alerts leaves this run to it.
                raise Failure(
                    f"pipeline {spec.name!r} blocked by {GROUP_CHECK.name}: {finding.message} "
                    "Nothing was read or committed; the table's other checks did not run.",
                    metadata={"blocked_by": GROUP_CHECK.name},
                )
            catalog = iceberg.load_catalog()
            route = active_route(spec, kafka, iceberg)  # a failover moves it to a replica
            source = route.kafka
            # An Avro pipeline's registry client (the resource's URL and credentials), closed
            # after the run.
            avro = spec.value_format == "avro"
            with (
                source.get_schema_registry_client(spec.schema_registry_url)
                if avro
                else nullcontext()
            ) as registry:
                report = run_pipeline(
                    route.spec,
                    source.client_config(),
                    catalog,
                    lambda: spark.spark_session,
                    source.get_cluster_id(),
                    run_id=context.run.run_id,
                    io_properties=iceberg.io_properties(),
                    schema_registry=registry,
                    cluster_config=lambda name: kafka.for_cluster(name).client_config(),
                    cluster=route.cluster,
                )
            for note in report.notes:
                context.log.warning(note)
            for error in (report.dead_letter_error, report.mirror and report.mirror.error):
                if error:
                    context.log.warning(error)
            if not report.committed:  # nothing ingested: no new materialization, dbt not rebuilt
                context.log.info(f"{spec.name!r}: nothing new to ingest; no materialization")
                return
            yield MaterializeResult(asset_key=table.key, metadata=run_metadata(report))
            if quarantine_key(spec) in context.selected_asset_keys:
                yield MaterializeResult(
                    asset_key=quarantine_key(spec),
                    metadata={
                        "quarantined_this_run": MetadataValue.int(report.quarantined),
                        "table": MetadataValue.text(spec.quarantine_table),
                    },
                )
        if commit_state_key(spec) in context.selected_asset_keys:
            catalog = iceberg.load_catalog()
            commits = (
                commits_of(catalog.load_table(spec.table), spec.consumer_group_id)
                if catalog.table_exists(spec.table)
                else []
            )
            yield MaterializeResult(
                asset_key=commit_state_key(spec),
                metadata=commit_log_metadata(commits, spec.consumer_group_id),
            )

    return _ingest


def build_pipeline_assets(spec: PipelineSpec) -> list[AssetSpec | AssetsDefinition]:
    """Every asset of one pipeline."""
    topics: list[AssetSpec | AssetsDefinition] = [
        build_topic_spec(spec, key) for key in topic_asset_keys(spec)
    ]
    return [*topics, build_ingestion_asset(spec)]
