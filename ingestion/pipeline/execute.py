"""Running the tasks of a plan: on Spark executors (or in-process), with the coordinator's
between-rounds work: new columns (R36), writer schemas looked up by id (R34) and a record guard's
candidates resolved (ingestion.task.spec)."""

from __future__ import annotations

import pickle
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ingestion import exceptions
from ingestion.formats.avro import fetch_schemas_by_id
from ingestion.formats.decode import merge_field_types
from ingestion.pipeline.commit import delete_files
from ingestion.pipeline.hooks import FailureHooks
from ingestion.pipeline.plan import Plan
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import TABLE_PREFIX
from ingestion.task.engine_version import engine_fingerprint
from ingestion.task.prepare import TaskResult, TaskSpec, run_task

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

    from ingestion.kafka.ranges import Key
    from ingestion.task.spec import RecordGuard, RunGuard

MAX_ROUNDS = 4  # a guard's candidates, unknown schema ids, new fields, then clean


def execute_on_spark(spark: SparkSession, specs: list[TaskSpec]) -> list[TaskResult]:
    """Run one Spark task per range; rows never leave the executors, only file metadata.

    The fan-out is a DataFrame of pickled task specs, one partition each, mapped with
    ``mapInArrow``: the same code on a classic session and on Spark Connect (which has no
    ``SparkContext``). Delivery: a failed or retried Spark task only writes files no commit
    names; the coordinator commits the results it collects, or nothing.
    """
    import pyarrow as pa
    from pyspark import cloudpickle

    payloads = [(i, cloudpickle.dumps(spec)) for i, spec in enumerate(specs)]
    frame = spark.createDataFrame(payloads, "i int, task binary").repartitionByRange(
        len(payloads), "i"
    )
    output = pa.schema([("i", pa.int32()), ("result", pa.binary())])

    pipeline = specs[0].pipeline

    def prepare(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # The task code is imported here, not pickled by reference with this function: an
        # executor that kept an engine of another layout cannot import it, and says so by name.
        try:
            from ingestion.task.prepare import run_task

            tasks = [
                (index, pickle.loads(payload))  # noqa: S301 - our own payload
                for batch in batches
                for index, payload in zip(
                    batch.column("i").to_pylist(), batch.column("task").to_pylist(), strict=True
                )
            ]
        except (ImportError, AttributeError) as exc:
            raise exceptions.EngineMismatchError(
                f"pipeline {pipeline!r}: this Spark executor cannot load the driver's task "
                f"({exc}): it runs another engine version than the driver. Restart the Spark "
                "Connect server or the executors with the driver's version, or set "
                "spark.ship_engine: true; nothing was read or written"
            ) from exc
        for index, spec in tasks:
            result = run_task(spec)
            yield pa.RecordBatch.from_pydict(
                {"i": [index], "result": [cloudpickle.dumps(result)]}, schema=output
            )

    try:
        with job_tags(spark, [pipeline_job_tag(pipeline)]):
            rows = frame.mapInArrow(prepare, "i int, result binary").collect()
    except Exception as exc:
        raise exceptions.TaskFailedError(task_failure_message(specs[0].pipeline, exc)) from exc
    return collected_results(pipeline, [(row["i"], row["result"]) for row in rows], len(specs))


def pipeline_job_tag(pipeline: str) -> str:
    """The tag of every Spark job that prepares a batch of ``pipeline`` (``job_tags``): shown in
    the Spark UI; ``SparkSession.interruptTag`` with it cancels the pipeline's jobs only."""
    return f"platform-pipeline-{pipeline}".replace(",", "_")


@contextmanager
def job_tags(spark: SparkSession, tags: list[str]) -> Iterator[None]:
    """Tag the Spark jobs this thread starts in the body (``SparkSession.addTag``, thread-local on
    a classic session and on Spark Connect): the Spark UI's jobs, and the Connect server's
    operations, show which pipeline each batch belongs to; ``interruptTag`` can cancel them."""
    valid = [tag.replace(",", "_") for tag in tags]  # Spark refuses a comma in a tag
    for tag in valid:
        spark.addTag(tag)
    try:
        yield
    finally:
        for tag in valid:
            spark.removeTag(tag)


def collected_results(pipeline: str, rows: list[tuple[int, bytes]], count: int) -> list[TaskResult]:
    """The tasks' results in task order, from what Spark collected: ``(task index, pickled
    result)`` rows. Exactly one result per task, or :class:`~ingestion.exceptions.TaskFailedError`:
    a missing task would commit a partial set (records skipped), a task twice (a speculative or
    retried attempt whose output Spark kept) its files twice (records duplicated)."""
    ordered = sorted(rows, key=lambda row: row[0])
    if [index for index, _ in ordered] != list(range(count)):  # never commit a partial set
        raise exceptions.TaskFailedError(
            f"pipeline {pipeline!r}: Spark returned results for tasks "
            f"{[index for index, _ in ordered]} of {count}; nothing was committed"
        )
    return [pickle.loads(result) for _, result in ordered]  # noqa: S301 - our own payload


def task_failure_message(pipeline: str, exc: Exception) -> str:
    """The engine's own error line from a Spark task failure, else the first line."""
    text = str(exc)
    names = [n for n in dir(exceptions) if n.endswith("Error") or n == "InjectedFailure"]
    for line in text.splitlines():
        if any(line.startswith((f"ingestion.exceptions.{n}", f"{n}:")) for n in names):
            return f"pipeline {pipeline!r}: a Spark task failed, nothing was committed: {line}"
    first = text.strip().splitlines()[0] if text.strip() else repr(exc)
    return f"pipeline {pipeline!r}: a Spark task failed, nothing was committed: {first}"


def execute_locally(specs: list[TaskSpec]) -> list[TaskResult]:
    """Run the tasks one after another in this process (debugging and small runs)."""
    return [run_task(spec) for spec in specs]


def task_metadata_json(table: Table) -> str:
    """The table metadata every task receives, as JSON: without the platform's own table
    properties (``kafka.*``: retired groups, dropped offsets, a record guard's record lists,
    ``kafka.uncopied.*``, megabytes for a large RPO tail, parsed by every task; a task gets its
    own partition's share in ``TaskSpec.guard``). Tasks read the schema, the partition spec, the
    location and the ``write.*`` properties, whatever the pipeline's spec says now."""
    metadata = table.metadata
    kept = {k: v for k, v in metadata.properties.items() if not k.startswith(TABLE_PREFIX)}
    if len(kept) == len(metadata.properties):
        return metadata.model_dump_json()
    return metadata.model_copy(update={"properties": kept}).model_dump_json()


def build_task_specs(
    spec: PipelineSpec,
    plan: Plan,
    table: Table,
    quarantine: Table | None,
    kafka_config: dict[str, Any],
    io_properties: dict[str, str],
    hooks: FailureHooks,
    writer_schemas: dict[int, str],
    guards: dict[Key, RecordGuard] | None = None,
    cluster: str = "primary",
) -> list[TaskSpec]:
    """One task spec per planned range; executors receive only the ``in_task`` hook and their
    partition's record guard (``guards``: ingestion.task.spec); ``cluster`` is the name of the
    cluster the ranges are read on, recorded in every row."""
    guards = guards or {}
    table_json = task_metadata_json(table)
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
            writer_schemas=writer_schemas,
            read_timeout_s=spec.read_timeout_seconds,
            headers=spec.headers,
            hooks=hooks.only("in_task"),
            engine_version=engine_fingerprint(),
            guard=guards.get((task.topic, task.partition)),
            cluster=cluster,
            key_fields=tuple(spec.key_fields or ()) if spec.mode == "upsert" else (),
            envelope=spec.envelope,
        )
        for task in plan.tasks
    ]


def evolve_schema(
    table: Table, new_fields: dict[str, pa.DataType], promotions: dict[str, pa.DataType]
) -> list[str]:
    """The coordinator's own schema commit, before the data commit: new optional columns
    (R36) and promotions Iceberg allows (int->long, float->double, decimal widening, R35).

    Any other type change is a decode rejection (dead-lettered or failing the run), so a
    column is never narrowed or retyped.
    """
    import pyarrow as pa
    from pyiceberg.types import DecimalType, DoubleType, LongType, PrimitiveType

    def iceberg_type(kind: pa.DataType) -> PrimitiveType:
        if pa.types.is_decimal(kind):
            return DecimalType(kind.precision, kind.scale)
        return LongType() if kind == pa.int64() else DoubleType()

    fields = [pa.field(name, kind, nullable=True) for name, kind in new_fields.items()]
    existing = {f.name for f in table.schema().fields}  # before: the commit updates ``table``
    with table.update_schema() as update:
        if fields:
            update.union_by_name(pa.schema(fields))
        for name, kind in promotions.items():
            update.update_column(name, field_type=iceberg_type(kind))
    changes = [
        f"added nested field(s) to {name}: now {kind}"
        if name in existing
        else f"added optional column {name} ({kind})"
        for name, kind in sorted(new_fields.items())
    ]
    return changes + [f"promoted {name} to {kind}" for name, kind in sorted(promotions.items())]


@dataclass
class Prepared:
    """The tasks' results and what the coordinator changed between rounds."""

    results: list[TaskResult]
    schema_changes: list[str] = field(default_factory=list)
    tasks_run: int = 0  # tasks executed, reruns included (on Spark when a session was given)


def prepare_files(
    specs: list[TaskSpec],
    table: Table,
    spark: SparkSession | None,
    registry: Any | None = None,
    guard: RunGuard | None = None,
) -> Prepared:
    """Run the tasks; rerun those that met new fields, unknown schema ids or a record guard's
    candidates once resolved (``guard.resolve``: for MM2's late copies it reads, on the
    clusters the guard names, the records the candidates may copy; ingestion.task.spec).

    Delivery: a rerun task writes a new file set; the discarded set is deleted at once (it
    was never committed, and the coordinator alone decides to rerun).
    """
    prepared = Prepared([])
    if not specs:
        return prepared
    results: dict[int, TaskResult] = {}
    pending = list(range(len(specs)))
    for _ in range(MAX_ROUNDS):
        batch = [specs[i] for i in pending]
        outputs = execute_on_spark(spark, batch) if spark is not None else execute_locally(batch)
        prepared.tasks_run += len(batch)
        results.update(zip(pending, outputs, strict=True))
        rerun = [i for i in pending if results[i].needs_rerun]
        if not rerun:
            prepared.results = [results[i] for i in range(len(specs))]
            return prepared
        new_fields: dict[str, pa.DataType] = {}
        promotions: dict[str, pa.DataType] = {}
        unknown: set[int] = set()
        for index in rerun:
            delete_files(table, results[index].data_files + results[index].quarantine_files)
            merge_field_types(new_fields, results[index].new_fields)
            promotions.update(results[index].promotions)
            unknown |= results[index].unknown_schema_ids
        writers, missing = dict(specs[0].writer_schemas), set(specs[0].missing_schema_ids)
        if unknown:
            found, not_found = fetch_schemas_by_id(registry, unknown)
            writers.update(found)
            missing |= not_found
        if new_fields or promotions:
            prepared.schema_changes += evolve_schema(table, new_fields, promotions)
            table.refresh()
        table_json = task_metadata_json(table)
        resolved: dict[Key, RecordGuard] = {}
        met: dict[Key, set[Hashable]] = {}
        for index in rerun:  # a partition split into several tasks: one set
            if results[index].guard_candidates:
                where = (specs[index].range.topic, specs[index].range.partition)
                met.setdefault(where, set()).update(results[index].guard_met)
        if guard is not None and met:
            resolved = guard.resolve(met)
        specs = [
            replace(
                s,
                table_metadata_json=table_json,
                writer_schemas=writers,
                missing_schema_ids=frozenset(missing),
                guard=resolved.get((s.range.topic, s.range.partition), s.guard),
            )
            for s in specs
        ]
        pending = rerun
    raise exceptions.SchemaEvolutionError(
        f"pipeline {specs[0].pipeline!r}: the schema kept changing after {MAX_ROUNDS} rounds"
    )
