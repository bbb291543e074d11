"""The one entry point: ``run_pipeline`` = plan -> prepare (Spark) -> commit -> mirror."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingestion import exceptions
from ingestion.formats.avro import avro_to_iceberg_schema, fetch_writer_schemas
from ingestion.formats.bad_values import DecodeStats
from ingestion.formats.debezium import row_schema_text
from ingestion.kafka.clients import client_properties
from ingestion.kafka.consumer import open_consumer
from ingestion.kafka.ranges import Key
from ingestion.pipeline.commit import commit_data, delete_files
from ingestion.pipeline.execute import build_task_specs, prepare_files
from ingestion.pipeline.hooks import NO_HOOKS, FailureHooks
from ingestion.pipeline.mirror import MirrorOutcome, mirror_table_offsets
from ingestion.pipeline.plan import Plan, build_plan
from ingestion.quarantine.dead_letters import (
    copy_pending_dead_letters,
)
from ingestion.quarantine.sync import quarantine_properties, sync_quarantine
from ingestion.replicas import replica_support
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import (
    SKIPPED,
    commit_properties,
    find_witness,
    flatten,
    skipped_property,
    snapshot_properties,
)
from ingestion.table.schema import load_or_create_quarantine_table, load_or_create_table
from ingestion.table.upsert import ApplyChanges, gather_changes, upsert_witness
from ingestion.task.spec import TaskResult

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka.admin import AdminClient
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession


@dataclass
class RunReport:
    """Everything a run did, for the Dagster surface and for logs (no secrets)."""

    pipeline: str
    commit_id: str
    offsets_before: dict[Key, int]
    offsets_after: dict[Key, int]
    end_offsets: dict[Key, int]
    records: int = 0
    quarantined: int = 0
    bytes_written: int = 0
    files: int = 0
    snapshot_id: int | None = None
    committed: bool = False
    replayed: bool = False
    schema_changes: list[str] = field(default_factory=list)
    lost_ranges: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mirror: MirrorOutcome | None = None
    dead_letter_copies: int = 0
    skipped: int = 0  # read and skipped by the tasks' record guard (MM2's late copies: R54)
    dead_letter_error: str | None = None
    valid_through_ms: int | None = None
    timings_s: dict[str, float] = field(default_factory=dict)
    decode_stats: DecodeStats = field(default_factory=DecodeStats)
    executed_in: str = ""  # "spark", "driver" (in_process_max_records), "" (nothing to read)
    spark_tasks: int = 0  # tasks run on Spark for this run, reruns included
    # mode: upsert (R57): what the commit did to the table's keys (a replayed commit's
    # counts are read from its snapshot), and the files it rewrote without the changed keys.
    mode: str = "append"
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    rewritten_files: int = 0

    @property
    def lag_after(self) -> int:
        """Offsets between what is committed and the end offsets seen at plan time."""
        return sum(
            max(0, self.end_offsets[k] - self.offsets_after.get(k, 0)) for k in self.end_offsets
        )

    @property
    def records_per_s(self) -> float:
        """Records committed per second of the whole run."""
        total = self.timings_s.get("total", 0.0)
        return self.records / total if total > 0 else 0.0


def _spark_for(
    spec: PipelineSpec, plan: Plan, spark: SparkSession | Callable[[], SparkSession] | None
) -> SparkSession | None:
    """The session for this run's tasks; None prepares them in this process."""
    if spark is None or plan.planned_offsets <= spec.in_process_max_records:
        return None
    return spark() if callable(spark) else spark


def run_pipeline(
    spec: PipelineSpec,
    kafka_config: dict[str, Any],
    catalog: Catalog,
    spark: SparkSession | Callable[[], SparkSession] | None,
    cluster_id: str,
    run_id: str | None = None,
    io_properties: dict[str, str] | None = None,
    hooks: FailureHooks = NO_HOOKS,
    schema_registry: Any | None = None,
    cluster_config: Callable[[str], dict[str, Any]] | None = None,
    cluster: str = "primary",
) -> RunReport:
    """Ingest what is new in the pipeline's topics into its table, exactly once.

    Args:
        spec: the pipeline.
        kafka_config: librdkafka properties (bootstrap servers, security); the engine adds the
            read settings it owns.
        catalog: the Iceberg catalog holding the table.
        spark: the session whose executors prepare the files, or a function returning it
            (called only when the run needs Spark); None runs tasks in-process. Runs planning
            at most ``spec.in_process_max_records`` offsets also run them in-process: the same
            task code, without paying Spark's start-up for a trickle.
        cluster_id: the Kafka cluster id, stored with the offsets.
        run_id: the orchestrator's run id, stored in the snapshot.
        io_properties: FileIO properties for executors (defaults to the catalog's).
        hooks: failure points for tests.
        schema_registry: a Schema Registry client for Avro values; by default one for the
            spec's ``schema_registry_url``.
        cluster_config: librdkafka properties of another cluster by name: after a failover
            with ``--source-lost``, the cluster left, read to tell MM2's late copies (R54,
            through the record guard of ``ingestion.replicas``); without it such a run refuses.
        cluster: the name of the cluster read (``primary`` or a replica's name in the platform
            configuration: ``platform_assets.route.Route.cluster``), recorded in every row's
            ``_kafka_cluster``.

    Delivery: exactly once. A crash before the commit leaves only unreferenced files; the next
    run re-plans the same start offsets. A retried or replayed commit is idempotent. Running
    the same pipeline twice at once commits one run; the other aborts (R7) and deletes its
    files. Bad records reach the quarantine table after the data commit that names their
    files, once (ingestion.quarantine.sync); every run, an idle one too, first catches up on what
    a crashed run left.

    Raises:
        IngestionError: any named failure (see ingestion.exceptions); nothing was committed unless
            the report of a previous call says so, or it is a ``QuarantineSyncError`` (the data
            commit stands; the next run syncs the quarantine table).
    """
    from confluent_kafka.admin import AdminClient

    started = time.monotonic()
    timings: dict[str, float] = {}
    # The registry is needed until the tasks are prepared; one made here is closed then.
    with _registry(spec, schema_registry) as registry:
        table = _open_table(catalog, spec, registry)
        check_table_mode(spec, table)
        admin = AdminClient(client_properties(kafka_config, "admin"))
        # read_committed: the planned end offsets are the last stable offsets (R16).
        replicas = replica_support(spec)  # None without replicas: no disaster-recovery code runs
        with open_consumer(kafka_config, f"{spec.name}-planner") as consumer:
            try:
                plan = build_plan(spec, table, admin, consumer, cluster_id)
            except exceptions.ClusterChangedError:
                if replicas is not None:  # a switch to another cluster landed: say that instead
                    replicas.check_cluster(table, spec.consumer_group_id, spec, cluster)
                raise
        if replicas is not None:  # planned on a route that changed since (R49)
            replicas.check_route(table, plan.group_id, spec, list(plan.committed or {}), cluster)
        timings["plan"] = time.monotonic() - started
        hooks.fire("after_plan", plan=plan)
        report = RunReport(
            pipeline=spec.name,
            commit_id=plan.commit_id,
            offsets_before=dict(plan.start),
            offsets_after=dict(plan.start),
            end_offsets=dict(plan.end),
            lost_ranges=[f"{r.topic}[{r.partition}] [{r.start}, {r.end})" for r in plan.lost],
            notes=list(plan.notes),
            valid_through_ms=plan.planned_at_ms,
            mode=spec.mode,
        )
        # A first run from "latest", a timestamp or explicit offsets pins its start offsets in a
        # snapshot even when there is nothing to read yet; otherwise the next run would resolve
        # "latest" again and skip what arrived in between.
        pin_start = plan.committed is None and spec.starting_position.mode != "earliest"
        if plan.is_empty and not pin_start:  # R10: no snapshot; still repair a stale mirror (R4)
            if plan.committed is not None:
                hooks.fire("before_mirror", plan=plan)
                _publish(spec, catalog, admin, kafka_config, report)
            report.timings_s = {**timings, "total": time.monotonic() - started}
            return report
        quarantine = (
            load_or_create_quarantine_table(catalog, spec)
            if spec.errors_tolerance == "all"
            else None
        )
        io_properties = io_properties if io_properties is not None else dict(catalog.properties)
        writers = {}
        if registry is not None:
            topics = sorted(plan.topic_ids)
            writers = fetch_writer_schemas(registry, spec.value_subjects(topics))
            if spec.mode == "upsert":  # a tombstone's key (Debezium's AvroConverter keys)
                writers |= fetch_writer_schemas(registry, spec.key_subjects(topics), absent_ok=True)
        guard = None
        if replicas is not None:  # MM2's late copies are held back from the tasks (R54)
            guard = replicas.run_guard(table, plan.group_id, spec.name, cluster_config)
        specs = build_task_specs(
            spec,
            plan,
            table,
            quarantine,
            kafka_config,
            io_properties,
            hooks,
            writers,
            guard.task_guards() if guard is not None else None,
            cluster,
        )
        session = _spark_for(spec, plan, spark)
        report.executed_in = "spark" if session is not None else "driver"
        prepared = prepare_files(specs, table, session, registry, guard)
    results = prepared.results
    report.skipped = sum(len(r.skipped) for r in results)
    if report.executed_in == "spark":
        report.spark_tasks = prepared.tasks_run
    report.schema_changes = prepared.schema_changes
    timings["prepare"] = time.monotonic() - started - timings["plan"]
    upsert = _gather_upsert(spec, results)
    data_files = [f for r in results for f in r.data_files]
    quarantine_files = [f for r in results for f in r.quarantine_files]
    report.records = sum(r.records for r in results)
    report.quarantined = sum(r.quarantined for r in results)
    for result in results:
        report.decode_stats.add(result.decode_stats)
    report.bytes_written = sum(r.bytes_written for r in results)
    report.files = len(data_files)
    hooks.fire("before_commit", plan=plan)
    stamps = [r.max_timestamp_ms for r in results if r.max_timestamp_ms is not None]
    # Every record produced before the plan is in, unless the run was capped.
    report.valid_through_ms = max(stamps) if plan.capped and stamps else plan.planned_at_ms
    committed_before = flatten(plan.committed or {})  # partitions new in this commit: R46
    properties = commit_properties(
        group_id=plan.group_id,
        offsets=plan.next_offsets(),
        commit_id=plan.commit_id,
        cluster_id=plan.cluster_id,
        pipeline=plan.pipeline,
        records=report.records,
        quarantined=report.quarantined,
        run_id=run_id or f"adhoc-{uuid.uuid4().hex[:12]}",
        valid_through_ms=report.valid_through_ms,
        lost_ranges=report.lost_ranges,
        run_duration_ms=int((time.monotonic() - started) * 1000),
        range_starts={k: o for k, o in plan.start.items() if k not in committed_before},
    )
    if report.skipped:  # records read and skipped: the audits count them
        properties[SKIPPED] = skipped_property(results)
    if (
        quarantine is not None
    ):  # the commit names its dead letters' files (ingestion.quarantine.sync)
        properties.update(quarantine_properties(quarantine, quarantine_files))
    if replicas is not None:  # a moved route outlives the expiry of its switch (R49)
        properties.update(replicas.commit_properties(table, plan.group_id))
    try:
        if upsert is None:
            witness = find_witness(table.schema(), results, cluster)
            outcome = commit_data(catalog, plan, data_files, properties, hooks, witness=witness)
        else:
            outcome = commit_data(catalog, plan, [], properties, hooks, apply=upsert)
    except exceptions.CommitConflictError:
        if quarantine is not None:  # no commit names them: no reader will ever see them
            delete_files(quarantine, quarantine_files)
        raise
    report.snapshot_id, report.replayed, report.committed = (
        outcome.snapshot_id,
        outcome.replayed,
        True,
    )
    report.offsets_after = dict(plan.end)
    if upsert is not None:
        _count_upsert(report, upsert, catalog, spec.table, outcome.snapshot_id)
    timings["commit"] = time.monotonic() - started - timings["plan"] - timings["prepare"]
    hooks.fire("after_commit", plan=plan, snapshot_id=outcome.snapshot_id)
    hooks.fire("before_mirror", plan=plan)
    _publish(spec, catalog, admin, kafka_config, report)
    report.timings_s = {**timings, "total": time.monotonic() - started}
    return report


def check_table_mode(spec: PipelineSpec, table: Table) -> None:
    """Refuse a pipeline whose ``mode`` is not the one its table was created for: an upsert
    into an append table would replace rows it never keyed, an append into an upsert table
    would add a second row per key."""
    from ingestion.formats.debezium import OP

    schema = table.schema()
    keyed = OP in schema.column_names
    if keyed and spec.mode == "upsert":
        keys = [schema.find_column_name(i) for i in sorted(schema.identifier_field_ids)]
        if sorted(n for n in keys if n) != sorted(spec.key_fields or []):
            raise exceptions.PipelineSpecError(
                f"pipeline {spec.name!r} has key_fields {spec.key_fields}, but table "
                f"{spec.table} is keyed by {keys}: re-keying would keep rows the new key never "
                "matches; nothing was read. Put the key back, or ingest into a new table"
            )
    if keyed == (spec.mode == "upsert"):
        return
    created = "mode: upsert" if keyed else "mode: append"
    raise exceptions.PipelineSpecError(
        f"pipeline {spec.name!r} has mode: {spec.mode}, but table {spec.table} was created "
        f"for {created}; nothing was read. Point the pipeline at a new table, or set mode "
        "back (docs/cdc.md)"
    )


def _gather_upsert(spec: PipelineSpec, results: list[TaskResult]) -> ApplyChanges | None:
    """The batch's changes to apply, in ``mode: upsert`` (None otherwise)."""
    if spec.mode != "upsert":
        return None
    keys = tuple(spec.key_fields or ())
    ordered = sorted(results, key=lambda r: (r.range.topic, r.range.partition, r.range.start))
    tables = [r.changes for r in ordered if r.changes is not None and r.changes.num_rows]
    if not tables:
        return ApplyChanges(_no_changes(ordered), keys)
    changes = gather_changes(tables, keys)
    return ApplyChanges(changes, keys, upsert_witness(changes))


def _no_changes(results: list[TaskResult]) -> pa.Table:
    """An empty batch of changes (its tasks decoded none: all set aside or skipped)."""
    import pyarrow as pa

    empty = [r.changes for r in results if r.changes is not None]
    return empty[0] if empty else pa.table({})


def _count_upsert(
    report: RunReport, upsert: ApplyChanges, catalog: Catalog, name: str, snapshot_id: int
) -> None:
    """The commit's counts: its plan's, or a replayed commit's snapshot summary."""
    from ingestion.table.upsert import read_counts

    plan = upsert.plan
    if plan is not None and not report.replayed:
        report.inserts, report.updates, report.deletes = plan.inserts, plan.updates, plan.deletes
        report.rewritten_files = len(plan.removed)
        report.files = len(plan.added)
        report.bytes_written += sum(f.file_size_in_bytes for f in plan.added)
        return
    snapshot = catalog.load_table(name).snapshot_by_id(snapshot_id)
    summary = snapshot_properties(snapshot) if snapshot is not None else {}
    counts = read_counts(summary)
    if counts is not None:
        report.inserts, report.updates, report.deletes = (
            counts.inserts,
            counts.updates,
            counts.deletes,
        )
        report.rewritten_files = counts.rewritten_files


def _publish(
    spec: PipelineSpec,
    catalog: Catalog,
    admin: AdminClient,
    kafka_config: dict[str, Any],
    report: RunReport,
) -> None:
    """Step 4: bring the quarantine table up to the table's commits, copy dead letters not yet
    copied, then mirror the offsets (the copy and the mirror best effort).

    The quarantine sync raises :class:`QuarantineSyncError` when it fails (the data commit
    stands; the next run, an idle one too, syncs again). The mirror moves only once the copies
    are out: a failed copy leaves the mirror behind, so the next run copies again (at least
    once) and repairs the mirror (R4). It mirrors the table's offsets as they are now, not this
    run's plan: a run that wakes late can only set the group to where the table is, and after a
    recorded rewind the group is moved back (R8, R48).
    """
    group = spec.consumer_group_id
    try:
        # One read of the table, before the quarantine sync, for the copy and the mirror: the
        # sync then reflects every commit this read saw (a commit whose rows it had not synced
        # would be "copied" as nothing), and the mirror moves the group only past commits this
        # read saw, never past one that landed meanwhile, its letters not copied (R33).
        table = catalog.load_table(spec.table)
    except Exception as exc:  # best effort, as the mirror itself: the next run repairs it
        report.mirror = MirrorOutcome(group, error=f"reading {spec.table} failed ({exc})")
        return
    sync_quarantine(catalog, spec)
    if spec.dead_letter_topic:
        try:
            copy = copy_pending_dead_letters(catalog, spec, table, admin, kafka_config)
        except Exception as exc:
            report.dead_letter_error = (
                f"copying dead letters of pipeline {spec.name!r} to {spec.dead_letter_topic!r} "
                f"failed ({exc}); the Kafka "
                f"group {group!r} mirror was left behind so the next run copies them again"
            )
            return
        report.dead_letter_copies = copy.copies
        if copy.created_topic:
            report.notes.append(
                f"created dead-letter topic {spec.dead_letter_topic!r} (partitions "
                f"{spec.dead_letter_topic_partitions}, replication factor "
                f"{spec.dead_letter_topic_replication_factor})"
            )
    report.mirror = mirror_table_offsets(admin, table, group)


@contextmanager
def _registry(spec: PipelineSpec, client: Any | None) -> Iterator[Any | None]:
    """The Schema Registry client of an Avro pipeline (None for other formats): ``client`` as
    given (its owner closes it), else one for the spec's ``schema_registry_url``, closed on
    exit."""
    if spec.value_format != "avro":
        yield None
    elif client is not None:
        yield client
    else:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        with SchemaRegistryClient({"url": spec.schema_registry_url}) as created:
            yield created


def _open_table(catalog: Catalog, spec: PipelineSpec, registry: Any | None) -> Table:
    """Load the table; create it from the declared schema, or the subject's latest Avro one."""
    derived = None
    if registry is not None and not spec.schema_fields and not catalog.table_exists(spec.table):
        subject = spec.value_subjects(spec.source_topics or ["<pattern>"])[0]
        text = registry.get_latest_version(subject).schema.schema_str
        try:
            if spec.mode == "upsert":  # the row a change carries, not its envelope
                text = row_schema_text(text, spec.envelope)
            derived = avro_to_iceberg_schema(text)
        except (ValueError, TypeError, KeyError) as exc:
            raise exceptions.PipelineSpecError(
                f"pipeline {spec.name!r}: no table schema from the latest {subject!r} in the "
                f"registry ({type(exc).__name__}: {exc}); check envelope and schema_subject, "
                "or declare schema: [...]"
            ) from exc
    return load_or_create_table(catalog, spec, derived)
