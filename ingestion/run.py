"""The one entry point: ``run_pipeline`` = plan -> prepare (Spark) -> commit -> mirror."""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ingestion import errors
from ingestion import offsets as props
from ingestion.commit import commit_data, commit_quarantine, delete_files
from ingestion.hooks import NO_HOOKS, FailureHooks
from ingestion.mirror import MirrorOutcome, mirror_offsets
from ingestion.offsets import flatten
from ingestion.plan import Key, Plan, build_plan
from ingestion.read import TaskResult, TaskSpec, run_task
from ingestion.spec import PipelineSpec
from ingestion.tables import load_or_create_quarantine_table, load_or_create_table

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

MAX_SCHEMA_ROUNDS = 3


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
    timings_s: dict[str, float] = field(default_factory=dict)

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


def _execute_spark(spark: SparkSession, specs: list[TaskSpec]) -> list[TaskResult]:
    """Run one Spark task per range; rows never leave the executors, only file metadata."""
    import pyarrow as pa
    from pyspark import cloudpickle

    payloads = [(i, cloudpickle.dumps(spec)) for i, spec in enumerate(specs)]
    rdd = spark.sparkContext.parallelize(payloads, numSlices=len(payloads))
    frame = spark.createDataFrame(rdd, "i int, task binary")

    output = pa.schema([("i", pa.int32()), ("result", pa.binary())])

    def prepare(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index, payload in zip(
                batch.column("i").to_pylist(), batch.column("task").to_pylist(), strict=True
            ):
                result = run_task(pickle.loads(payload))  # noqa: S301 - our own payload
                yield pa.RecordBatch.from_pydict(
                    {"i": [index], "result": [cloudpickle.dumps(result)]}, schema=output
                )

    try:
        rows = frame.mapInArrow(prepare, "i int, result binary").collect()
    except Exception as exc:
        raise errors.TaskFailedError(_task_failure_message(specs[0].pipeline, exc)) from exc
    ordered = sorted(rows, key=lambda row: row["i"])
    return [pickle.loads(row["result"]) for row in ordered]  # noqa: S301 - our own payload


def _task_failure_message(pipeline: str, exc: Exception) -> str:
    """The engine's own error line from a Spark task failure, else the first line."""
    text = str(exc)
    names = [name for name in dir(errors) if name.endswith("Error") or name == "InjectedFailure"]
    for line in text.splitlines():
        if any(line.startswith(f"ingestion.errors.{n}") or line.startswith(f"{n}:") for n in names):
            return f"pipeline {pipeline!r}: a Spark task failed, nothing was committed: {line}"
    first = text.strip().splitlines()[0] if text.strip() else repr(exc)
    return f"pipeline {pipeline!r}: a Spark task failed, nothing was committed: {first}"


def _execute_local(specs: list[TaskSpec]) -> list[TaskResult]:
    """Run the tasks one after another in this process (debugging and small runs)."""
    return [run_task(spec) for spec in specs]


def _task_specs(
    spec: PipelineSpec, plan: Plan, table: Table, quarantine: Table | None,
    kafka_config: dict[str, Any], io_properties: dict[str, str], hooks: FailureHooks,
) -> list[TaskSpec]:  # fmt: skip
    table_json = table.metadata.model_dump_json()
    quarantine_json = quarantine.metadata.model_dump_json() if quarantine is not None else None
    return [
        TaskSpec(
            pipeline=spec.name,
            range=task,
            kafka_config=kafka_config,
            value_format=spec.value_format,
            key_format=spec.key_format,
            table_metadata_json=table_json,
            quarantine_metadata_json=quarantine_json,
            io_properties=io_properties,
            errors_tolerance=spec.errors_tolerance,
            commit_id=plan.commit_id,
            hooks=hooks.only("in_task"),
        )
        for task in plan.tasks
    ]


def _evolve_schema(table: Table, new_fields: dict[str, pa.DataType]) -> list[str]:
    """Add new optional columns (the coordinator's own schema commit, before the data commit)."""
    import pyarrow as pa

    with table.update_schema() as update:
        update.union_by_name(
            pa.schema([pa.field(n, t, nullable=True) for n, t in new_fields.items()])
        )
    return [f"added optional column {name} ({kind})" for name, kind in sorted(new_fields.items())]


def run_pipeline(
    spec: PipelineSpec,
    kafka_config: dict[str, Any],
    catalog: Catalog,
    spark: SparkSession | None,
    cluster_id: str,
    run_id: str | None = None,
    io_properties: dict[str, str] | None = None,
    hooks: FailureHooks = NO_HOOKS,
) -> RunReport:
    """Ingest what is new in the pipeline's topics into its table, exactly once.

    Args:
        spec: the pipeline.
        kafka_config: librdkafka properties (bootstrap servers, security); the engine adds the
            read settings it owns.
        catalog: the Iceberg catalog holding the table.
        spark: the session whose executors prepare the files; None runs tasks in-process.
        cluster_id: the Kafka cluster id, stored with the offsets.
        run_id: the orchestrator's run id, stored in the snapshot.
        io_properties: FileIO properties for executors (defaults to the catalog's).
        hooks: failure points for tests.

    Delivery: exactly once. A crash before the commit leaves only unreferenced files; the next
    run re-plans the same start offsets. A retried or replayed commit is idempotent. Running
    the same pipeline twice at once commits one run; the other aborts (R7).

    Raises:
        IngestionError: any named failure (see ingestion.errors); nothing was committed unless
            the report of a previous call says so.
    """
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

    started = time.monotonic()
    timings: dict[str, float] = {}
    table = load_or_create_table(catalog, spec)
    admin = AdminClient(dict(kafka_config))
    consumer = Consumer(
        {
            **kafka_config,
            "group.id": f"kafka-iceberg-{spec.name}-planner",  # never joined (R25)
            "enable.auto.commit": False,
            "isolation.level": "read_committed",  # end offsets = last stable offsets
        }
    )
    try:
        plan = build_plan(spec, table, admin, consumer, cluster_id)
    finally:
        consumer.close()
    timings["plan"] = time.monotonic() - started
    hooks.fire("after_plan", plan=plan)
    report = RunReport(
        pipeline=spec.name, commit_id=plan.commit_id,
        offsets_before=dict(plan.start), offsets_after=dict(plan.start), end_offsets=dict(plan.end),
        lost_ranges=[f"{r.topic}[{r.partition}] [{r.start}, {r.end})" for r in plan.lost],
        notes=list(plan.notes),
    )  # fmt: skip
    if plan.is_empty:  # R10: nothing to read, no snapshot; still repair a stale mirror (R4)
        if plan.committed is not None:
            hooks.fire("before_mirror", plan=plan)
            report.mirror = mirror_offsets(admin, spec.consumer_group_id, flatten(plan.committed))
        report.timings_s = {**timings, "total": time.monotonic() - started}
        return report
    quarantine = (
        load_or_create_quarantine_table(catalog, spec) if spec.errors_tolerance == "all" else None
    )
    io_properties = io_properties if io_properties is not None else dict(catalog.properties)
    results = _prepare(
        spec, plan, table, quarantine, kafka_config, io_properties, hooks, spark, report
    )
    timings["prepare"] = time.monotonic() - started - timings["plan"]
    data_files = [f for r in results for f in r.data_files]
    quarantine_files = [f for r in results for f in r.quarantine_files]
    report.records = sum(r.records for r in results)
    report.quarantined = sum(r.quarantined for r in results)
    report.bytes_written = sum(r.bytes_written for r in results)
    report.files = len(data_files)
    hooks.fire("before_commit", plan=plan)
    properties = _snapshot_properties(plan, report, run_id, results)
    if quarantine is not None:
        commit_quarantine(
            quarantine,
            plan.commit_id,
            quarantine_files,
            {props.COMMIT_ID: plan.commit_id, props.PIPELINE: spec.name},
        )
    outcome = commit_data(catalog, plan, data_files, properties, hooks)
    report.snapshot_id, report.replayed, report.committed = (
        outcome.snapshot_id,
        outcome.replayed,
        True,
    )
    report.offsets_after = {k: v for k, v in plan.end.items()}
    timings["commit"] = time.monotonic() - started - timings["plan"] - timings["prepare"]
    hooks.fire("after_commit", plan=plan, snapshot_id=outcome.snapshot_id)
    hooks.fire("before_mirror", plan=plan)
    report.mirror = mirror_offsets(admin, spec.consumer_group_id, dict(plan.end))
    report.timings_s = {**timings, "total": time.monotonic() - started}
    return report


def _prepare(
    spec: PipelineSpec, plan: Plan, table: Table, quarantine: Table | None,
    kafka_config: dict[str, Any], io_properties: dict[str, str], hooks: FailureHooks,
    spark: SparkSession | None, report: RunReport,
) -> list[TaskResult]:  # fmt: skip
    """Run the tasks; when some report new fields, evolve the schema and run those again."""
    specs = _task_specs(spec, plan, table, quarantine, kafka_config, io_properties, hooks)
    results: dict[int, TaskResult] = {}
    pending = list(range(len(specs)))
    for _ in range(MAX_SCHEMA_ROUNDS):
        batch = [specs[i] for i in pending]
        outputs = _execute_spark(spark, batch) if spark is not None else _execute_local(batch)
        results.update(zip(pending, outputs, strict=True))
        evolving = [i for i in pending if results[i].new_fields]
        if not evolving:
            return [results[i] for i in range(len(specs))]
        new_fields: dict[str, pa.DataType] = {}
        for index in evolving:  # their files lack the new columns: discard and run again
            delete_files(table, results[index].data_files + results[index].quarantine_files)
            new_fields.update(results[index].new_fields)
        report.schema_changes += _evolve_schema(table, new_fields)
        table.refresh()
        table_json = table.metadata.model_dump_json()
        specs = [replace(s, table_metadata_json=table_json) for s in specs]
        pending = evolving
    raise errors.SchemaEvolutionError(
        f"pipeline {spec.name!r}: the schema kept changing after {MAX_SCHEMA_ROUNDS} rounds"
    )


def _snapshot_properties(
    plan: Plan, report: RunReport, run_id: str | None, results: list[TaskResult]
) -> dict[str, str]:
    """Snapshot properties of the data commit (offsets, ids, counts); no secrets."""
    stamps = [r.max_timestamp_ms for r in results if r.max_timestamp_ms is not None]
    properties = {
        props.OFFSETS_PREFIX + plan.group_id: props.encode_offsets(plan.next_offsets()),
        props.COMMIT_ID: plan.commit_id,
        props.GROUP_ID: plan.group_id,
        props.CLUSTER_ID: plan.cluster_id,
        props.PIPELINE: plan.pipeline,
        props.RUN_ID: run_id or f"adhoc-{uuid.uuid4().hex[:12]}",
        props.RECORDS: str(report.records),
        props.DEAD_LETTERED: str(report.quarantined),
        props.VALID_THROUGH_MS: str(max(stamps) if stamps else plan.planned_at_ms),
    }
    if plan.lost:
        properties[props.LOST_RANGES] = ";".join(report.lost_ranges)
    return properties
