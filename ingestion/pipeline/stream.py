"""Continuous mode: one long-lived loop that commits every few seconds through ``run_pipeline``.

Each iteration is one ordinary run of the coordinator path (plan -> tasks -> one
compare-and-set commit carrying the offsets -> publish): nothing here writes to the table or to
Kafka by itself, so every guarantee of a run holds for each iteration. Every batch runs its
tasks on the Spark session the caller provides, as a run does; a spec that opts into
``in_process_max_records`` prepares batches up to that size in this process. The orchestrator
(``platform_assets/streaming/jobs.py``) owns the process: it decides when to stop (a spec
change, a reload, a blocked group check) and reports each commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingestion import exceptions
from ingestion.pipeline.hooks import NO_HOOKS, FailureHooks
from ingestion.pipeline.run import RunReport, run_pipeline
from ingestion.spec.pipeline import PipelineSpec

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession


STREAM_MAX_RECORDS_PER_ITERATION = 1_000_000
"""A stream iteration reads at most this many offsets when the spec sets no
``max_records_per_run``: a backlog drains in bounded iterations (the next starts at once), so
one pipeline's catch-up neither runs past the hung-iteration limit nor holds a shared Spark for
long (R52)."""


@dataclass
class StreamSummary:
    """What one stream did before it stopped."""

    iterations: int = 0
    commits: int = 0
    records: int = 0
    conflicts: int = 0
    stopped_because: str = ""


ROUTE_MOVED_LIMIT = 3
"""Plans refused in a row on a moved route before the stream fails: should_stop ends it first."""


def stream_pipeline(
    spec: PipelineSpec,
    kafka_config: dict[str, Any],
    catalog: Catalog,
    cluster_id: str,
    interval_s: float,
    should_stop: Callable[[], str | None],
    on_report: Callable[[RunReport], None],
    spark: SparkSession | Callable[[], SparkSession] | None = None,
    run_id: str | None = None,
    io_properties: dict[str, str] | None = None,
    hooks: FailureHooks = NO_HOOKS,
    schema_registry: Any | None = None,
    on_conflict: Callable[[str], None] = lambda message: None,
    sleep: Callable[[float], None] = time.sleep,
    cluster_config: Callable[[str], dict[str, Any]] | None = None,
    cluster: str = "primary",
) -> StreamSummary:
    """Ingest the pipeline continuously: one ``run_pipeline`` every ``interval_s`` seconds.

    ``should_stop`` is asked before every iteration; a non-None answer (the reason) ends the
    loop cleanly between commits. ``on_report`` receives every iteration's report (committed
    or not: ``report.committed`` says which); ``on_conflict`` each lost compare-and-set;
    ``cluster`` names the cluster read, recorded in every row (``run_pipeline``).

    Delivery: exactly once, as run-per-commit, because each iteration is one: a kill at any
    point leaves at most unreferenced files, and the next stream (or run) re-plans from the
    table's offsets. A commit that loses its compare-and-set (an operator's reset, rewind or
    quarantine replay, or another run, committed first) deletes its files and raises
    :class:`CommitConflictError`; the stream then plans again from the new offsets, never
    overwriting them. A failover or failback that lands after ``should_stop`` read the route
    makes the next plan refuse (:class:`RouteClusterError`, nothing read): counted as a conflict,
    and ``should_stop`` (which compares the route) ends the stream. Any other error ends the
    stream (the orchestrator restarts it).
    """
    summary = StreamSummary()
    if spec.max_records_per_run is None:
        spec = spec.model_copy(update={"max_records_per_run": STREAM_MAX_RECORDS_PER_ITERATION})
    moved = 0  # plans refused in a row because the route moved
    while True:
        reason = should_stop()
        if reason is not None:
            summary.stopped_because = reason
            return summary
        started = time.monotonic()
        summary.iterations += 1
        try:
            report = run_pipeline(
                spec,
                kafka_config,
                catalog,
                spark,
                cluster_id,
                run_id=run_id,
                io_properties=io_properties,
                hooks=hooks,
                schema_registry=schema_registry,
                cluster_config=cluster_config,
                cluster=cluster,
            )
        except exceptions.CommitConflictError as exc:  # re-plan at once from the new head
            summary.conflicts += 1
            on_conflict(str(exc))
            continue
        except exceptions.RouteClusterError as exc:  # a switch landed since should_stop read
            # the route: nothing was committed; should_stop sees the new route and stops the
            # stream (its caller starts the next one there) instead of failing it. A should_stop
            # that does not (a caller passing the wrong cluster) ends the stream the third time.
            moved += 1
            if moved >= ROUTE_MOVED_LIMIT:
                raise
            summary.conflicts += 1
            on_conflict(str(exc))
            sleep(interval_s)
            continue
        moved = 0
        if report.committed:
            summary.commits += 1
            summary.records += report.records
        on_report(report)
        if report.lag_after > 0 and report.committed:
            continue  # capped by max_records_per_run: drain the backlog without waiting
        sleep(max(0.0, interval_s - (time.monotonic() - started)))
