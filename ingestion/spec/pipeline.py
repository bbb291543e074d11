"""Pipeline specs: one validated model per pipeline, loaded from YAML.

A pipeline maps one topic (or a list of topics, or a regex pattern) to one Iceberg table under
one group id. Every invalid spec fails at load time with a message that names the pipeline and
the offending key, before anything is read or committed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ingestion.exceptions import PipelineSpecError
from ingestion.spec.replicas import ReplicaSpec
from ingestion.spec.types import TypeStringError, parse_type_string

_NAME = r"^[a-z][a-z0-9_]*$"
_TRANSFORM = re.compile(r"^(identity|year|month|day|hour|void|bucket\[(\d+)\]|truncate\[(\d+)\])$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FieldSpec(_Model):
    """One column of the declared Iceberg schema (a top-level field of the record value)."""

    name: str
    type: str = Field(
        description="Iceberg primitive (long, string, timestamptz, decimal(p,s)...) or nested: "
        "struct<a:long not null, b:string>, list<T>, map<K, V> (ingestion/spec/types.py)."
    )
    required: bool = False
    doc: str | None = None

    @field_validator("type")
    @classmethod
    def _check_type(cls, value: str) -> str:
        try:
            parse_type_string(value)
        except TypeStringError as exc:
            raise ValueError(f"unknown type: {exc}") from None
        return value.strip().lower()


class PartitionFieldSpec(_Model):
    """One partition field: a source column and an Iceberg transform."""

    source: str
    transform: str = "identity"
    name: str | None = None

    @field_validator("transform")
    @classmethod
    def _check_transform(cls, value: str) -> str:
        match = _TRANSFORM.match(value.strip().lower())
        if not match or (match[2] or match[3] or "1") == "0":
            raise ValueError(
                f"unknown transform {value!r}; use identity, year, month, day, hour, "
                "bucket[N] or truncate[N] with N > 0"
            )
        return value.strip().lower()


class StartingPosition(_Model):
    """Where a pipeline starts when its table holds no offsets for its group (only then).

    Exactly one of ``earliest``, ``latest``, ``timestamp_ms`` or ``offsets`` (keyed
    ``"topic:partition"``; partitions not listed start at their earliest offset).
    """

    mode: Literal["earliest", "latest", "timestamp", "offsets"] = "earliest"
    timestamp_ms: int | None = None
    offsets: dict[str, int] | None = None

    @model_validator(mode="after")
    def _check_mode(self) -> StartingPosition:
        if (self.mode == "timestamp") != (self.timestamp_ms is not None):
            raise ValueError("timestamp_ms is required with mode 'timestamp' and only then")
        if (self.mode == "offsets") != (self.offsets is not None):
            raise ValueError("offsets is required with mode 'offsets' and only then")
        for key, offset in (self.offsets or {}).items():
            topic, _, partition = key.rpartition(":")
            if not topic or not partition.isdigit() or offset < 0:
                raise ValueError(f"offsets key {key!r}: use 'topic:partition' and an offset >= 0")
        return self


PositiveInt = Annotated[int, Field(gt=0)]


# Spark does the work by default: every run and stream batch with something to read
# runs its tasks on the Spark the platform attaches (Connect or a cluster). A user may opt into
# preparing small batches in the run process instead: measured with bench/run_cost.py (2
# cores), the run process beat a warm Spark Connect server (local[2]) up to 100k records (1.3 s
# against 4.2 s for 100k), at the price of the run process's CPU and memory and of Spark's task
# retries and UI (docs/pipelines.md, in_process_max_records).
IN_PROCESS_MAX_RECORDS = 0


class PipelineSpec(_Model):
    """One pipeline: source topics, target table, group ids, format and delivery rules."""

    name: str = Field(pattern=_NAME)
    topic: str | None = None
    topics: list[str] | None = None
    topic_pattern: str | None = None
    table: str = Field(description="Iceberg identifier 'namespace.table'.")
    consumer_group_id: str = Field(
        min_length=1,
        description="The Kafka group where progress is mirrored, and the key of the offsets in "
        "the table: one id for both.",
    )
    commit_group_id: str | None = Field(
        default=None,
        description="Accepted for Kafka Connect users (iceberg.connect.group-id); must equal "
        "consumer_group_id, which is the one the platform uses.",
    )
    value_format: Literal["json", "avro", "raw"] = "json"
    key_format: Literal["raw", "string", "json"] = "raw"
    key_schema: list[FieldSpec] | None = Field(
        default=None,
        description="With key_format 'json': the key's fields; the key lands as the struct "
        "column _kafka_key (a key that does not decode is a rejection, like a bad value).",
    )
    headers: bool = Field(
        default=False,
        description="Store the record headers as _kafka_headers list<struct<key:string, "
        "value:binary>> (in order, repeated keys kept).",
    )
    schema_registry_url: str | None = None
    schema_subject: str | None = Field(
        default=None, description="Registry subject of the values; default '<topic>-value'."
    )
    schema_fields: list[FieldSpec] | None = Field(default=None, alias="schema")
    partition_by: list[PartitionFieldSpec] = Field(default_factory=list)
    starting_position: StartingPosition = Field(default_factory=StartingPosition)
    max_records_per_task: PositiveInt = 250_000
    max_records_per_run: PositiveInt | None = None
    in_process_max_records: int = Field(
        default=IN_PROCESS_MAX_RECORDS,
        ge=0,
        description="Opt-in shortcut: runs and stream batches planning at most this many "
        "offsets prepare their files in the run process without starting or attaching Spark. "
        "0 (the default): Spark does every batch. The same task code and delivery; up to "
        "100,000 the run process was faster than a warm Spark Connect server on 2 cores "
        "(bench/run_cost.py). Run metadata says where each batch ran (executed_in).",
    )
    read_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A task fails (nothing committed) after this long without read progress.",
    )
    target_file_size_bytes: PositiveInt = 128 * 1024 * 1024
    errors_tolerance: Literal["none", "all"] = "none"
    quarantine_table: str = Field(
        default="", description="The quarantine (dead-letter) table; '<table>_quarantine' if unset."
    )
    dead_letter_topic: str | None = Field(
        default=None,
        description="A Kafka copy of the quarantined records, with Kafka Connect's context "
        "headers; a run creates it when it does not exist (dead_letter_topic_partitions, "
        "dead_letter_topic_replication_factor).",
    )
    dead_letter_topic_partitions: PositiveInt = Field(
        default=1,
        description="Partitions of the dead-letter topic when a run creates it (as Kafka "
        "Connect's errors.deadletterqueue.topic.* do); an existing topic is left as is.",
    )
    dead_letter_topic_replication_factor: int = Field(
        default=-1,
        description="Replication factor of the dead-letter topic when a run creates it; -1: the "
        "broker's default.replication.factor (Kafka's CreateTopics).",
    )
    on_data_loss: Literal["fail", "skip"] = "fail"
    max_lag_records: PositiveInt = 10_000
    max_lag_seconds: PositiveInt = 300
    freshness_target_seconds: PositiveInt | None = Field(
        default=None,
        description="Produce -> queryable target; derives the triggers "
        "(ingestion.health.triggers): below the run-per-commit floor the pipeline streams, "
        "above it max_lag_seconds derives from it. Unset: the lag sensor uses max_lag_records / "
        "max_lag_seconds as given.",
    )
    freshness_bound_seconds: PositiveInt = 900
    retention_margin_records: PositiveInt = 10_000
    max_dead_letter_ratio: float = Field(default=0.01, ge=0, le=1)
    fallback_cron: str = "*/15 * * * *"
    snapshot_retention_hours: float | None = Field(
        default=None,
        gt=0,
        description="Snapshots older than this are expired by the pipeline's maintenance "
        "schedule (the offsets watermark always kept, rule 7). Unset: a stream's last 480 "
        "commits (30 min at a 15 s target), 168 h otherwise (ingestion.ops.retention).",
    )
    audit_recount_offsets: PositiveInt = Field(
        default=3_000_000,
        description="Offsets the exactly-once audit recounts in Kafka per evaluation (every 5 "
        "minutes); the rest waits, reported as its backlog. The default takes ~30 s at the "
        "measured ~100k offsets/s (bench/recount.py) and covers 10,000 records/s sustained.",
    )
    replicas: list[ReplicaSpec] = Field(
        default_factory=list, description="MirrorMaker 2 replicas a failover may switch to."
    )
    mode: Literal["append", "upsert"] = Field(
        default="append",
        description="append: every record becomes a row. upsert: the topic carries keyed "
        "changes (Debezium); the table holds the current row per key_fields, replaced by "
        "copy-on-write (ingestion/table/upsert.py, docs/cdc.md).",
    )
    key_fields: list[str] | None = Field(
        default=None,
        description="With mode 'upsert': the columns that identify a row (the source table's "
        "primary key, as in Debezium's record key). Created required, and the table's "
        "identifier fields and sort order.",
    )
    envelope: Literal["debezium", "flattened"] = Field(
        default="debezium",
        description="With mode 'upsert': debezium (before/after/op/source) or flattened "
        "(ExtractNewRecordState: the row with __op/__deleted). A null value (tombstone) "
        "deletes the record key's row in both.",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def replica(self, name: str) -> ReplicaSpec:
        """The replica ``name`` of this pipeline (a clear error naming the known ones)."""
        for replica in self.replicas:
            if replica.name == name:
                return replica
        known = [replica.name for replica in self.replicas]
        raise PipelineSpecError(
            f"pipeline {self.name!r} has no replica {name!r} (replicas: {known}): add it under "
            "replicas: in the pipeline spec"
        )

    def value_subjects(self, topics: list[str]) -> list[str]:
        """Schema Registry subjects of the values of ``topics`` (topic name strategy)."""
        return [self.schema_subject] if self.schema_subject else [f"{t}-value" for t in topics]

    def key_subjects(self, topics: list[str]) -> list[str]:
        """Schema Registry subjects of the keys of ``topics`` (topic name strategy)."""
        return [f"{t}-key" for t in topics]

    @property
    def source_topics(self) -> list[str]:
        """The fixed topic list (empty for a pattern pipeline, whose topics are listed at plan)."""
        return [self.topic] if self.topic else list(self.topics or [])

    @model_validator(mode="before")
    @classmethod
    def _default_quarantine_table(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("quarantine_table") and "table" in data:
            return {**data, "quarantine_table": f"{data['table']}_quarantine"}
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> PipelineSpec:
        sources = [self.topic, self.topics, self.topic_pattern]
        if sum(source is not None for source in sources) != 1:
            raise ValueError("set exactly one of topic, topics or topic_pattern")
        if self.topics is not None and (
            not self.topics or len(set(self.topics)) != len(self.topics)
        ):
            raise ValueError("topics must be a non-empty list without repeats")
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise ValueError(f"topic_pattern is not a valid regex: {exc}") from exc
        if self.table.count(".") < 1 or any(not part for part in self.table.split(".")):
            raise ValueError(f"table {self.table!r} must be 'namespace.table'")
        if self.commit_group_id is not None and self.commit_group_id != self.consumer_group_id:
            raise ValueError(
                f"commit_group_id {self.commit_group_id!r} differs from consumer_group_id "
                f"{self.consumer_group_id!r}: offsets would be committed under one group and "
                "progress reported under another. Set both to the same id (or drop "
                "commit_group_id); to move a pipeline to a new group use the group migration "
                "operation, not a config edit"
            )
        if self.freshness_target_seconds is not None and "max_lag_seconds" in self.model_fields_set:
            raise ValueError(
                "set freshness_target_seconds or max_lag_seconds, not both: the lag sensor's "
                "age trigger derives from freshness_target_seconds (see ingestion.health.triggers)"
            )
        replica_names = [replica.name for replica in self.replicas]
        if len(set(replica_names)) != len(replica_names) or "primary" in replica_names:
            raise ValueError(
                f"replicas {replica_names}: names must be unique and not 'primary' (the "
                "pipeline's own cluster)"
            )
        if self.replicas and self.topic_pattern is not None:
            raise ValueError("replicas need a topic list (topics: [...]), not a topic_pattern")
        if self.dead_letter_topic_replication_factor == 0 or (
            self.dead_letter_topic_replication_factor < -1
        ):
            raise ValueError(
                f"dead_letter_topic_replication_factor {self.dead_letter_topic_replication_factor}"
                ": set a positive number of replicas, or -1 for the broker's default"
            )
        if self.dead_letter_topic is not None and not self.dead_letter_topic.strip():
            raise ValueError("dead_letter_topic is empty: name a topic, or remove the key")
        if self.value_format == "avro" and not self.schema_registry_url:
            raise ValueError("value_format 'avro' needs schema_registry_url")
        if self.value_format == "json" and not self.schema_fields:
            raise ValueError("value_format 'json' needs a declared schema (schema: [...])")
        if (self.key_format == "json") != bool(self.key_schema):
            raise ValueError("key_schema is required with key_format 'json' and only then")
        names = [field.name for field in self.schema_fields or []]
        if len(set(names)) != len(names):
            raise ValueError("schema has repeated field names")
        if any(name.startswith("_kafka_") for name in names):
            raise ValueError("schema field names must not start with '_kafka_' (metadata columns)")
        self._check_upsert(names)
        partitionable = {*names, "_kafka_topic", "_kafka_partition", "_kafka_timestamp"}
        unknown = [part.source for part in self.partition_by if part.source not in partitionable]
        if unknown and self.schema_fields is not None:
            raise ValueError(f"partition_by sources {unknown} are not schema or _kafka_ columns")
        return self

    def _check_upsert(self, names: list[str]) -> None:
        if (self.mode == "upsert") != bool(self.key_fields):
            raise ValueError("key_fields is required with mode 'upsert' and only then")
        if self.mode != "upsert":
            return
        keys = list(self.key_fields or [])
        if len(set(keys)) != len(keys):
            raise ValueError(f"key_fields {keys} repeat a field")
        if self.value_format == "raw":
            raise ValueError(
                "mode 'upsert' reads change events in JSON or Avro (value_format: json or "
                "avro); raw values carry no row"
            )
        if self.schema_fields is not None or self.value_format == "json":
            # Avro without a declared schema: checked when the table is derived from the
            # registry (ingestion.table.schema.build_schema)
            types = {field.name: field.type for field in self.schema_fields or []}
            problem = key_fields_problem(keys, types)
            if problem:
                raise ValueError(problem)
        if any(name.startswith("_cdc_") for name in names):
            raise ValueError("schema field names must not start with '_cdc_' (change columns)")
        if self.replicas:
            raise ValueError("mode 'upsert' with replicas (failover) is not supported yet")


def key_fields_problem(keys: list[str], types: dict[str, str]) -> str | None:
    """Why ``keys`` cannot key a ``mode: upsert`` table of columns ``types`` (name -> type as
    the spec writes it, e.g. ``long``, ``struct<...>``), or None."""
    unknown = [key for key in keys if key not in types]
    if unknown:
        return f"key_fields {unknown} are not columns of schema"
    nested = [key for key in keys if types[key].startswith(("struct", "list", "map"))]
    if nested:
        return f"key_fields {nested} must be primitive columns"
    unkeyable = [
        key
        for key in keys
        if types[key] in ("float", "double", "uuid", "binary") or types[key].startswith("fixed")
    ]
    if unkeyable:  # Iceberg refuses float identifier fields; NaN and -0.0 do not compare
        return f"key_fields {unkeyable}: float, double, uuid, binary and fixed cannot be keys"
    return None


def _format_error(
    pipeline: str, exc: ValidationError, where: Callable[[tuple[str | int, ...]], str] | None = None
) -> str:
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "<spec>"
        at = f"{where(tuple(error['loc']))}: " if where else ""
        lines.append(f"  {at}{key}: {error['msg'].removeprefix('Value error, ')}")
    return f"pipeline {pipeline!r} is invalid:\n" + "\n".join(lines)


def parse_pipeline_spec(
    raw: dict[str, Any], where: Callable[[tuple[str | int, ...]], str] | None = None
) -> PipelineSpec:
    """Validate one raw mapping into a :class:`PipelineSpec`; ``where`` names the place of a
    key path in the file it came from (``file:line``).

    Raises:
        PipelineSpecError: the spec is invalid; the message names the pipeline and the key.
    """
    name = str(raw.get("name", "<unnamed>")) if isinstance(raw, dict) else "<unnamed>"
    try:
        return PipelineSpec.model_validate(raw)
    except ValidationError as exc:
        raise PipelineSpecError(_format_error(name, exc, where)) from None


def load_pipeline_specs(path: str | Path) -> list[PipelineSpec]:
    """Load and validate every pipeline of a YAML file (a top-level ``pipelines:`` list).

    Example:
        >>> specs = load_pipeline_specs("platform_assets/pipelines.yaml")
        >>> [spec.name for spec in specs]
        ['orders']

    Raises:
        PipelineSpecError: the file cannot be read or is malformed, a spec is invalid, or two
            pipelines share a name, a table or a group id; each message names the file and,
            where it can, the line (``file:line: key: what is wrong``).
    """
    from ingestion.spec.source_lines import key_lines, line_of, yaml_error_line

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PipelineSpecError(
            f"{path}: cannot read the pipelines file ({exc.strerror})"
        ) from None
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        line = yaml_error_line(exc)
        problem = getattr(exc, "problem", None) or str(exc)
        at = f"{path}:{line}" if line else str(path)
        raise PipelineSpecError(f"{at}: not valid YAML: {problem}") from None
    if not isinstance(document, dict) or not isinstance(document.get("pipelines"), list):
        raise PipelineSpecError(f"{path}: expected a top-level 'pipelines:' list")
    lines = key_lines(text)

    def where_in(index: int) -> Callable[[tuple[str | int, ...]], str]:
        def where(loc: tuple[str | int, ...]) -> str:
            line = line_of(lines, ("pipelines", index, *loc))
            return f"{path}:{line}" if line else str(path)

        return where

    specs = [parse_pipeline_spec(raw, where_in(i)) for i, raw in enumerate(document["pipelines"])]
    for attribute in ("name", "table", "consumer_group_id"):
        values = [getattr(spec, attribute) for spec in specs]
        repeats = sorted({value for value in values if values.count(value) > 1})
        if repeats:
            raise PipelineSpecError(f"{path}: pipelines share {attribute} {repeats}")
    return specs
