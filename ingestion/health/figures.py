"""A pipeline's monitoring figures, computed from what its table and Kafka say now.

The metrics endpoint (``platform metrics``, :mod:`platform_assets.metrics`) is a pull exporter in
the style of kafka-lag-exporter and Burrow: every figure is computed when it is scraped, from the
state :func:`ingestion.health.state.read_state` read and the commits the table's snapshots
carry, never from counters kept in a run's process (those die with the run, and a stream
worker, a run per commit and an operator action all commit to the same table). So the figures
are the table's: a scrape and ``platform status`` agree, whichever process committed.

- **lag in records** per partition: Kafka's end (the last stable offset, what a
  ``read_committed`` reader can reach) minus the next offset the table's newest commit of the
  group carries (:meth:`PipelineState.lag`, the lag sensor's figure);
- **lag in seconds** per partition: the age of the oldest uncommitted record, 0 when caught up
  (:func:`ingestion.health.lag.measure_lag_age`, the ``commit_freshness`` check's figure);
- **the last commit's duration**: ``kafka.run-duration-ms`` of the newest ingestion commit
  (plan to commit: planning, reading and writing the files, up to the catalog commit);
- **records, bytes and dead letters per second** over the last ``window_s`` seconds: the sums of
  ``kafka.records``, ``added-files-size`` and ``kafka.quarantined`` of the group's commits whose
  snapshot is newer than ``now - window_s``, divided by ``window_s`` (what Prometheus' ``rate()``
  over that window would give for a counter of them).

Nothing here reads or writes: it is pure, given the commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ingestion.health.lag import measure_lag_age
from ingestion.health.state import Commit, PipelineState
from ingestion.table.offsets import RUN_DURATION_MS

ADDED_FILES_SIZE = "added-files-size"  # Iceberg's snapshot summary: bytes of data files added
TOTAL_RECORDS = "total-records"  # Iceberg's snapshot summary: rows in the table after it
DEFAULT_WINDOW_S = 300.0
"""The rates' window: five minutes, Prometheus' usual ``rate()`` range, and long enough to hold
several commits of a run-per-commit pipeline with a 60 s freshness target."""


@dataclass(frozen=True)
class PartitionFigures:
    """One partition: Kafka's end, the table's next offset, the lag in records and seconds."""

    topic: str
    partition: int
    end: int
    committed: int | None
    lag_records: int
    lag_seconds: float | None  # None: the age cannot be bounded (a future timestamp, no commit)


@dataclass(frozen=True)
class PipelineFigures:
    """What the metrics endpoint exports for one pipeline (see the module docstring)."""

    pipeline: str
    window_s: float
    partitions: list[PartitionFigures] = field(default_factory=list)
    last_commit_ms: int | None = None
    last_commit_snapshot_id: int | None = None
    last_commit_duration_s: float | None = None
    window_commits: int = 0
    window_records: int = 0
    window_bytes: int = 0
    window_dead_letters: int = 0

    @property
    def records_per_second(self) -> float:
        return self.window_records / self.window_s

    @property
    def bytes_per_second(self) -> float:
        return self.window_bytes / self.window_s

    @property
    def dead_letters_per_second(self) -> float:
        return self.window_dead_letters / self.window_s


def _number(properties: dict[str, str], key: str) -> int:
    text = properties.get(key, "")
    return int(text) if text.isdigit() else 0


def in_window(commits: list[Commit], now_ms: int, window_s: float) -> list[Commit]:
    """The commits whose snapshot is newer than ``now_ms - window_s`` (and not after ``now_ms``).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> commits = [NS(timestamp_ms=t) for t in (9_000, 6_000, 4_000)]
        >>> [c.timestamp_ms for c in in_window(commits, 10_000, 5.0)]
        [9000, 6000]
    """
    since = now_ms - window_s * 1000
    return [c for c in commits if since < c.timestamp_ms <= now_ms]


def pipeline_figures(
    state: PipelineState,
    now_ms: int,
    window_s: float = DEFAULT_WINDOW_S,
    commits: list[Commit] | None = None,
) -> PipelineFigures:
    """The figures of ``state`` at ``now_ms`` (pure).

    ``state`` should be read with its oldest uncommitted timestamps (``with_oldest``), else a
    lagging partition's age is unknown. ``commits``: the group's commits newest first, at least
    back to ``now_ms - window_s`` (default: ``state.commits``, the newest 100).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> props = {"kafka.run-duration-ms": "2500", "added-files-size": "4096"}
        >>> state = NS(spec=NS(name="orders"), committed_offsets={("t", 0): 7},
        ...     end_offsets={("t", 0): 10}, lag=lambda: {("t", 0): 3},
        ...     oldest_uncommitted_ms={("t", 0): 995_000},
        ...     uncommitted_ranges=lambda: {("t", 0): (7, 10)},
        ...     commits=[NS(snapshot_id=5, timestamp_ms=992_000, records=7, quarantined=1,
        ...                 properties=props)])
        >>> f = pipeline_figures(state, now_ms=1_000_000, window_s=10)
        >>> f.partitions[0].lag_records, f.partitions[0].lag_seconds, f.last_commit_duration_s
        (3, 5.0, 2.5)
        >>> f.records_per_second, f.bytes_per_second, f.dead_letters_per_second
        (0.7, 409.6, 0.1)
    """
    commits = state.commits if commits is None else commits
    committed, lag = state.committed_offsets, state.lag()
    waited = measure_lag_age(state, now_ms)
    partitions = [
        PartitionFigures(
            topic=topic,
            partition=partition,
            end=end,
            committed=committed.get((topic, partition)),
            lag_records=lag.get((topic, partition), 0),
            lag_seconds=(
                waited.partitions.get((topic, partition))
                if lag.get((topic, partition), 0) > 0
                else 0.0
            ),
        )
        for (topic, partition), end in sorted(state.end_offsets.items())
    ]
    last = commits[0] if commits else None
    timed = next((c for c in commits if RUN_DURATION_MS in c.properties), None)
    recent = in_window(commits, now_ms, window_s)
    return PipelineFigures(
        pipeline=state.spec.name,
        window_s=window_s,
        partitions=partitions,
        last_commit_ms=last.timestamp_ms if last else None,
        last_commit_snapshot_id=last.snapshot_id if last else None,
        last_commit_duration_s=(
            _number(timed.properties, RUN_DURATION_MS) / 1000 if timed is not None else None
        ),
        window_commits=len(recent),
        window_records=sum(c.records for c in recent),
        window_bytes=sum(_number(c.properties, ADDED_FILES_SIZE) for c in recent),
        window_dead_letters=sum(c.quarantined for c in recent),
    )


def table_records(summary: dict[str, str] | None) -> int | None:
    """Rows in a table after its current snapshot (``total-records`` of its summary), or None.

    Example:
        >>> table_records({"total-records": "42"}), table_records(None)
        (42, None)
    """
    if summary is None or not summary.get(TOTAL_RECORDS, "").isdigit():
        return None
    return int(summary[TOTAL_RECORDS])
