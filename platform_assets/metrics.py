"""The metrics endpoint: every pipeline's lag, commits, throughput, dead letters and checks,
for Prometheus (OpenMetrics text format), computed when it is scraped.

``platform metrics`` serves it (``make dev`` starts it on port 9464); docs/production.md lists
every metric. It is a pull exporter in the style of kafka-lag-exporter and Burrow: a
:class:`prometheus_client.registry.Collector` whose ``collect()`` reads the real sources on each
scrape, the table's snapshots and Kafka through :class:`platform_assets.state.StateReader` (what
the lag sensor and ``platform status`` read), the checks' newest evaluations and the table's
newest materialization from the Dagster instance. It keeps no counter of its own: a run's
process, a stream worker and an operator action all commit to the table, and whichever process
committed, the scrape sees it; restarting the exporter loses nothing.

Why prometheus-client rather than OpenTelemetry's Prometheus exporter: the figures are read at
scrape time (gauges of the table and Kafka, as kafka-lag-exporter's are), which is what a
custom ``Collector`` does directly; OpenTelemetry's SDK would need an observable instrument per
figure, a meter provider and its reader for the same text, and adds four packages to the code
location's environment. Its collector scrapes this endpoint as it would any other.

Labels hold names only (pipeline, topic, partition, check, table, group): never a
configuration value, so no secret can reach a label.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.registry import Collector

from ingestion.exceptions import PipelineSpecError
from ingestion.health.figures import (
    DEFAULT_WINDOW_S,
    PipelineFigures,
    pipeline_figures,
    table_records,
)
from ingestion.health.state import NEWEST_COMMITS, commits_of
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import snapshot_properties
from platform_assets.pipelines import load_pipelines, table_key
from platform_assets.state import StateReader
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from prometheus_client.metrics_core import Metric
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

PREFIX = "kafka_iceberg_"
DEFAULT_PORT = 9464  # OpenTelemetry's Prometheus exporter's default port
CHECK_STATES = ("passed", "warn", "error", "blocked", "unknown")
"""A check's state: its newest completed evaluation passed, failed with WARN or ERROR, was not
evaluated because the blocking group check fails (``blocked``), or none is recorded yet."""

# name (without the prefix) -> (help, labels). The one list of what the endpoint exports: the
# collector builds its families from it, the docs and the dashboard are tested against it.
PARTITION = ("pipeline", "topic", "partition")
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "pipeline_up": (
        "1 when the pipeline's table and Kafka were read at this scrape, 0 when reading failed",
        ("pipeline",),
    ),
    "pipeline_info": (
        "The pipeline's table and consumer group id (value 1)",
        ("pipeline", "table", "group", "mode"),
    ),
    "lag_records": (
        "Kafka's end (last stable) offset minus the next offset the table's newest commit "
        "carries, per partition",
        PARTITION,
    ),
    "lag_seconds": (
        "Age of the partition's oldest uncommitted record (0 when caught up); a future producer "
        "timestamp is bounded by the last commit",
        PARTITION,
    ),
    "end_offset": ("Kafka's end (last stable) offset of the partition", PARTITION),
    "committed_offset": (
        "The next offset of the partition in the table's newest commit of the group",
        PARTITION,
    ),
    "last_commit_timestamp_seconds": (
        "When the table's newest commit of the group was made (Unix time)",
        ("pipeline",),
    ),
    "last_commit_snapshot": (
        "The snapshot id of the table's newest commit of the group (value 1)",
        ("pipeline", "snapshot_id"),
    ),
    "last_commit_duration_seconds": (
        "The newest ingestion commit's duration from plan to commit (kafka.run-duration-ms)",
        ("pipeline",),
    ),
    "last_commit_phase_seconds": (
        "The phases of the table asset's newest materialization (plan, prepare, commit, total), "
        "from the Dagster instance",
        ("pipeline", "phase"),
    ),
    "commits_per_second": (
        "Commits of the group per second over the window (--window, 300 s by default)",
        ("pipeline",),
    ),
    "records_per_second": (
        "Records committed per second over the window (sum of kafka.records / window)",
        ("pipeline",),
    ),
    "bytes_per_second": (
        "Bytes of data files committed per second over the window (sum of added-files-size / "
        "window)",
        ("pipeline",),
    ),
    "dead_letters_per_second": (
        "Records set aside as dead letters per second over the window (sum of "
        "kafka.quarantined / window)",
        ("pipeline",),
    ),
    "table_records": (
        "Rows in the table at its current snapshot (total-records)",
        ("pipeline",),
    ),
    "dead_letters": (
        "Dead letters kept: rows in the pipeline's quarantine table (errors_tolerance: all)",
        ("pipeline",),
    ),
    "check_state": (
        "Each asset check's state from its newest completed evaluation (1 for the current "
        "state): passed, warn, error, blocked (not evaluated: the group check fails), unknown",
        ("pipeline", "check", "state"),
    ),
    "check_timestamp_seconds": (
        "When the check's newest completed evaluation was recorded (Unix time)",
        ("pipeline", "check"),
    ),
    "scrape_duration_seconds": ("How long this scrape took to read every pipeline", ()),
}


def metric_names() -> set[str]:
    """Every metric name the endpoint exports, prefixed (as a query or a dashboard names it)."""
    return {PREFIX + name for name in METRICS}


@dataclass(frozen=True)
class PipelineReading:
    """What one scrape read of one pipeline: its figures and the table's row counts."""

    spec: PipelineSpec
    figures: PipelineFigures
    table_records: int | None
    dead_letters: int | None


class PlatformCollector(Collector):
    """The collector ``platform metrics`` registers: each ``collect()`` reads every pipeline of
    the pipelines file afresh.

    ``instance``: the Dagster instance the checks and materializations are read from (None:
    those metrics are left out). ``specs``: the pipelines (default: the pipelines file, read at
    each scrape, so a reload of the code location and the exporter see the same file; an
    invalid file keeps the last valid list). ``redact`` masks secrets in logged errors.
    """

    def __init__(
        self,
        kafka: KafkaResource,
        iceberg: IcebergCatalogResource,
        instance: DagsterInstance | None = None,
        window_s: float = DEFAULT_WINDOW_S,
        specs: Callable[[], list[PipelineSpec]] = load_pipelines,
        redact: Callable[[str], str] = str,
    ) -> None:
        self.kafka, self.iceberg, self.instance = kafka, iceberg, instance
        self.window_s, self.specs, self.redact = window_s, specs, redact
        self._reader = StateReader(kafka, iceberg)
        self._lock = threading.Lock()  # the HTTP server answers scrapes in threads
        self._last_specs: list[PipelineSpec] = []

    def close(self) -> None:
        """Close the Kafka clients kept between scrapes."""
        with self._lock:
            self._reader.__exit__(None, None, None)

    def _pipelines(self) -> list[PipelineSpec]:
        try:
            self._last_specs = self.specs()
        except PipelineSpecError as exc:
            log.warning("metrics: the pipelines file is invalid, keeping the last one: %s", exc)
        return self._last_specs

    def read(self, spec: PipelineSpec, now_ms: int) -> PipelineReading:
        """One pipeline's figures at ``now_ms``, read from the table and Kafka."""
        state, table = self._reader.read_with_table(spec, with_oldest=True)
        commits = state.commits
        since = now_ms - self.window_s * 1000
        if (
            table is not None
            and len(commits) >= NEWEST_COMMITS  # all recent: the window may hold more
            and commits[-1].timestamp_ms > since
        ):
            commits = commits_of(table, spec.consumer_group_id, limit=1_000_000)
        figures = pipeline_figures(state, now_ms, self.window_s, commits)
        dead_letters = None
        if spec.errors_tolerance == "all":
            dead_letters = self._quarantine_records(spec)
        return PipelineReading(spec, figures, _table_records(table), dead_letters)

    def _quarantine_records(self, spec: PipelineSpec) -> int:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            quarantine = self._reader.catalog().load_table(spec.quarantine_table)
        except NoSuchTableError:
            return 0  # created with the first commit that sets a record aside
        return _table_records(quarantine) or 0

    def collect(self) -> Iterator[Metric]:
        """Every metric family, read now (the ``Collector`` protocol)."""
        with self._lock:
            yield from self._collect()

    def _collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        started = time.monotonic()
        families = {
            name: GaugeMetricFamily(
                PREFIX + name,
                help_text,
                labels=list(labels),
                unit="seconds" if name.endswith("_seconds") else "",
            )
            for name, (help_text, labels) in METRICS.items()
        }

        def add(name: str, labels: list[str], value: float) -> None:
            families[name].add_metric(labels, value)

        now_ms = int(time.time() * 1000)
        for spec in self._pipelines():
            add("pipeline_info", [spec.name, spec.table, spec.consumer_group_id, spec.mode], 1)
            try:
                reading = self.read(spec, now_ms)
            except Exception as exc:  # one unreadable pipeline does not fail the scrape
                log.warning(
                    "metrics: pipeline %r could not be read: %s",
                    spec.name,
                    self.redact(f"{type(exc).__name__}: {exc}"[:500]),
                )
                add("pipeline_up", [spec.name], 0)
            else:
                add("pipeline_up", [spec.name], 1)
                for name, labels, value in pipeline_samples(reading):
                    add(name, labels, value)
            if self.instance is not None:
                for name, labels, value in self._dagster_samples(spec):
                    add(name, labels, value)
        add("scrape_duration_seconds", [], time.monotonic() - started)
        yield from families.values()

    def _dagster_samples(self, spec: PipelineSpec) -> Iterator[tuple[str, list[str], float]]:
        """The checks' states and the newest materialization's phases, from the instance."""
        assert self.instance is not None
        try:
            yield from check_samples(self.instance, spec)
            yield from phase_samples(self.instance, spec)
        except Exception as exc:  # the instance's storage unreachable: those metrics are absent
            log.warning("metrics: the Dagster instance could not be read: %s", exc)


def _table_records(table: Table | None) -> int | None:
    snapshot = table.current_snapshot() if table is not None else None
    return table_records(snapshot_properties(snapshot)) if snapshot is not None else None


def pipeline_samples(reading: PipelineReading) -> Iterator[tuple[str, list[str], float]]:
    """The samples of one pipeline's table and Kafka figures: (metric, label values, value)."""
    figures, name = reading.figures, reading.spec.name
    for p in figures.partitions:
        labels = [name, p.topic, str(p.partition)]
        yield "lag_records", labels, p.lag_records
        yield "end_offset", labels, p.end
        if p.lag_seconds is not None:
            yield "lag_seconds", labels, p.lag_seconds
        if p.committed is not None:
            yield "committed_offset", labels, p.committed
    if figures.last_commit_ms is not None:
        yield "last_commit_timestamp_seconds", [name], figures.last_commit_ms / 1000
        yield "last_commit_snapshot", [name, str(figures.last_commit_snapshot_id)], 1
    if figures.last_commit_duration_s is not None:
        yield "last_commit_duration_seconds", [name], figures.last_commit_duration_s
    yield "commits_per_second", [name], figures.window_commits / figures.window_s
    yield "records_per_second", [name], figures.records_per_second
    yield "bytes_per_second", [name], figures.bytes_per_second
    yield "dead_letters_per_second", [name], figures.dead_letters_per_second
    if reading.table_records is not None:
        yield "table_records", [name], reading.table_records
    if reading.dead_letters is not None:
        yield "dead_letters", [name], reading.dead_letters


def check_samples(
    instance: DagsterInstance, spec: PipelineSpec
) -> Iterator[tuple[str, list[str], float]]:
    """Each of the pipeline's checks (those ``check_alerts`` watches): its state and when its
    newest completed evaluation was recorded."""
    from platform_assets.alerts.sensors import read_new_evaluations
    from platform_assets.ingest.checks import pipeline_check_keys

    keys = pipeline_check_keys(spec)
    newest, _ = read_new_evaluations(instance, keys, None)
    by_check = {evaluation.check: evaluation for evaluation in newest}
    for key in keys:
        evaluation = by_check.get(key.name)
        if evaluation is None:
            state = "unknown"
        elif evaluation.blocked_by:
            state = "blocked"
        elif evaluation.passed:
            state = "passed"
        else:
            state = evaluation.severity.lower()  # "warn" or "error"
        for candidate in CHECK_STATES:
            yield "check_state", [spec.name, key.name, candidate], float(candidate == state)
        if evaluation is not None:
            yield "check_timestamp_seconds", [spec.name, key.name], evaluation.timestamp


def phase_samples(
    instance: DagsterInstance, spec: PipelineSpec
) -> Iterator[tuple[str, list[str], float]]:
    """The phases (``timings_s``) of the table asset's newest materialization, if any."""
    entry = instance.get_latest_materialization_event(table_key(spec))
    materialization = entry.asset_materialization if entry is not None else None
    timings: Any = materialization.metadata.get("timings_s") if materialization else None
    if timings is None or not isinstance(timings.value, dict):
        return
    for phase, seconds in sorted(timings.value.items()):
        if isinstance(seconds, int | float):
            yield "last_commit_phase_seconds", [spec.name, phase], float(seconds)


def serve(collector: PlatformCollector, host: str, port: int) -> Any:
    """Serve ``collector`` on ``http://host:port/metrics`` in a background thread (OpenMetrics
    text to a scraper that accepts it, as Prometheus does; Prometheus text otherwise); return
    the server (``shutdown()`` stops it)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)  # nothing read at registration
    registry.register(collector)
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server
