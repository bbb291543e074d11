"""Helpers for engine tests: small specs, record generators and a harness around run_pipeline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from ingestion.audit.oracle import AuditResult, audit_table
from ingestion.exceptions import InjectedFailure
from ingestion.ops.reset import ResetRequest, plan_reset
from ingestion.pipeline.hooks import NO_HOOKS, FailureHooks
from ingestion.pipeline.mirror import read_group_offsets
from ingestion.pipeline.run import RunReport, run_pipeline
from ingestion.spec.pipeline import PipelineSpec, StartingPosition, parse_pipeline_spec
from ingestion.table.offsets import find_committed_state, flatten
from resources.kafka import KafkaResource
from tests.support.ledger import Coordinates, Ledger, Record

CreateTopic = Callable[..., str]
"""``create_topic(partitions=3, name=None, **config)`` -> a fresh topic: the fixture."""
NewPipeline = Callable[..., tuple[str, PipelineSpec]]
"""``new_pipeline(name, partitions=1, produce=0, **overrides)`` -> (topic, spec): the fixture."""
PIPELINE_CHECKS = frozenset(
    {
        "group_id_consistency",
        "commit_freshness",
        "exactly_once_audit",
        "retention_risk",
        "dead_letter_rate",
        "offsets_watermark_reachable",
    }
)
"""The asset checks every pipeline's table has."""


def crash(point: str, **context: Any) -> None:
    """A failure hook that crashes the run at ``point``."""
    raise InjectedFailure(f"injected crash at {point}")


def make_spec(topic: str, name: str, **overrides: Any) -> PipelineSpec:
    """A small JSON pipeline: id (required long), name, amount decimal(10,2), ts timestamptz."""
    raw: dict[str, Any] = {
        "name": name,
        "topic": topic,
        "table": f"tests.{name}",
        "consumer_group_id": f"group-{name}",
        "value_format": "json",
        "key_format": "string",
        "schema": [
            {"name": "id", "type": "long", "required": True},
            {"name": "name", "type": "string"},
            {"name": "amount", "type": "decimal(10,2)"},
            {"name": "ts", "type": "timestamptz"},
        ],
        "max_records_per_task": 400,
        "in_process_max_records": 0,  # the engine's tests exercise Spark unless they opt out
    }
    raw.update(overrides)
    if "topic_pattern" in overrides or "topics" in overrides:
        raw.pop("topic")
    return parse_pipeline_spec(raw)


def records(count: int, first: int = 0, partition: int | None = None) -> list[Record]:
    """Valid JSON records with ids ``first .. first + count - 1``."""
    return [
        (
            f"k{i}".encode(),
            orjson.dumps(
                {"id": i, "name": f"n{i}", "amount": f"{i % 1000}.25", "ts": "2026-11-22T10:00:00Z"}
            ),
            partition,
        )
        for i in range(first, first + count)
    ]


@dataclass
class Harness:
    """Runs pipelines on the real stack and judges them with the oracle."""

    kafka: KafkaResource
    catalog: Catalog
    spark: SparkSession
    cluster_id: str

    def run(
        self,
        spec: PipelineSpec,
        hooks: FailureHooks = NO_HOOKS,
        use_spark: bool = True,
        registry: Any | None = None,
    ) -> RunReport:
        """One run of ``spec``; ``registry``: a Schema Registry client for an Avro spec (by
        default the run builds one for the spec's ``schema_registry_url``)."""
        return run_pipeline(
            spec,
            self.kafka.client_config(),
            self.catalog,
            self.spark if use_spark else None,
            self.cluster_id,
            run_id="test",
            hooks=hooks,
            schema_registry=registry,
        )

    def table(self, spec: PipelineSpec) -> Table:
        """The pipeline's table, freshly loaded."""
        return self.catalog.load_table(spec.table)

    def plan_reset(self, spec: PipelineSpec, position: StartingPosition | ResetRequest) -> Any:
        """An offset reset of ``spec`` to ``position`` (or a ``ResetRequest``: ``--shift-by``,
        ``--to-offset``, ``--topic``), planned against the broker (no write): an
        ``OffsetReset``, typed ``Any`` so that tests can do arithmetic on its changes."""
        consumer = self.kafka.get_consumer()
        try:
            return plan_reset(
                spec, self.table(spec), self.kafka.get_admin_client(), consumer, position
            )
        finally:
            consumer.close()

    def audit(
        self, spec: PipelineSpec, ledger: Ledger, lost: set[Coordinates] | None = None
    ) -> AuditResult:
        """The oracle against the ledger's committed records of the spec's topics."""
        quarantine = None
        if spec.errors_tolerance == "all" and self.catalog.table_exists(spec.quarantine_table):
            quarantine = self.catalog.load_table(spec.quarantine_table)
        expected = {c for c in ledger.committed() if c[0] in self.topics(spec, ledger)}
        return audit_table(self.table(spec), spec.consumer_group_id, quarantine, expected, lost)

    def assert_commits_audited(self, spec: PipelineSpec) -> Any:
        """The production audit (ingestion.audit.incremental) over every commit of ``spec``,
        recounted in Kafka: no finding; returns it (a ``CommitAudit``)."""
        from ingestion.audit.incremental import audit_commits

        table, group = self.table(spec), spec.consumer_group_id
        config = self.kafka.client_config()
        audit = audit_commits(table, group, config, spec.name, max_offsets=None)
        assert audit.findings == [], audit.findings
        return audit

    @staticmethod
    def topics(spec: PipelineSpec, ledger: Ledger) -> set[str]:
        """Topics of the spec (for a pattern: those in the ledger that match)."""
        import re

        if spec.topic_pattern:
            pattern = re.compile(spec.topic_pattern)
            return {e.topic for e in ledger.entries if pattern.fullmatch(e.topic)}
        return set(spec.source_topics)

    def assert_exactly_once(
        self, spec: PipelineSpec, ledger: Ledger, lost: set[Coordinates] | None = None
    ) -> AuditResult:
        """Fail the test with the oracle's findings unless everything landed exactly once."""
        result = self.audit(spec, ledger, lost)
        assert result.ok, result.summary()
        return result

    def assert_mirror_matches_table(self, spec: PipelineSpec) -> None:
        """The Kafka group mirror holds exactly the offsets the table committed."""
        state = find_committed_state(self.table(spec), spec.consumer_group_id)
        assert state is not None
        mirrored = read_group_offsets(self.kafka.get_admin_client(), spec.consumer_group_id)
        assert mirrored == flatten(state.offsets)
