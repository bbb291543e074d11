"""How long a pipeline keeps its table's history, and when its maintenance runs (pure).

Every commit rewrites the table metadata, which lists every snapshot still kept, so the cost of a
commit grows with the history kept: measured with ``bench/snapshot_cost.py`` (pyiceberg 0.12, SQL
catalog), 34 ms with 20 snapshots, 321 ms with 250, 705 ms with 500 (docs/operate.md, "Why a stream
keeps little history"). A stream commits every few seconds (~23,000 snapshots a day at one commit
per 3.75 s), so it keeps its last :data:`STREAM_SNAPSHOT_BUDGET` commits (30 min at the shipped 15 s
target), expired every 15 minutes: at most ~720 snapshots, where a commit costs well under its
interval. A pipeline that runs per commit with a freshness target keeps its last
:data:`RUN_SNAPSHOT_BUDGET` commits, expired every 15 minutes; any other keeps a week, expired once
a day. Expiry always keeps the offsets watermark (rule 7) whatever the retention; the orphan window
is 72 h for every pipeline and never shorter than twice the longest run
(``ingestion.ops.maintenance.orphan_window``).
"""

from __future__ import annotations

from ingestion.health.triggers import (
    RUN_PER_COMMIT_FLOOR_SECONDS,
    SENSOR_INTERVAL_SECONDS,
    commit_interval_seconds,
    is_continuous,
)
from ingestion.spec.pipeline import PipelineSpec

STREAM_SNAPSHOT_BUDGET = 480  # commits a stream keeps: 30 min at 3.75 s, 8 min at 1 s
BATCH_SNAPSHOT_RETENTION_HOURS = 24.0 * 7
# commits a run-per-commit pipeline with a freshness target keeps (about 1.4 s per commit,
# bench/snapshot_cost.py): a target of 30 s can commit at every lag-sensor tick
RUN_SNAPSHOT_BUDGET = 1000
MAX_ORPHAN_WINDOW_HOURS = 72.0  # the CLI's and the maintain_tables job's default


def snapshot_retention_hours(spec: PipelineSpec) -> float:
    """Hours of snapshots the maintenance schedule keeps: the spec's; else, for a stream, its
    last :data:`STREAM_SNAPSHOT_BUDGET` commits (at its commit interval); for a pipeline run
    per commit with a freshness target, its last :data:`RUN_SNAPSHOT_BUDGET` commits at the
    shortest interval its trigger allows (at most a week); otherwise a week.

    Example:
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> base = {"name": "p", "topic": "t", "table": "n.t", "consumer_group_id": "g",
        ...     "value_format": "raw"}
        >>> snapshot_retention_hours(parse_pipeline_spec({**base, "freshness_target_seconds": 15}))
        0.5
        >>> snapshot_retention_hours(parse_pipeline_spec({**base, "freshness_target_seconds": 4}))
        0.13
        >>> snapshot_retention_hours(parse_pipeline_spec({**base, "freshness_target_seconds": 30}))
        4.17
        >>> snapshot_retention_hours(parse_pipeline_spec({**base, "freshness_target_seconds": 900}))
        168.0
        >>> snapshot_retention_hours(parse_pipeline_spec(base))
        168.0
        >>> snapshot_retention_hours(parse_pipeline_spec({**base, "snapshot_retention_hours": 2}))
        2.0
    """
    if spec.snapshot_retention_hours is not None:
        return float(spec.snapshot_retention_hours)
    if is_continuous(spec):
        return round(STREAM_SNAPSHOT_BUDGET * commit_interval_seconds(spec) / 3600, 2)
    target = spec.freshness_target_seconds
    if target is not None:  # runs as often as every tick when the target is near the floor
        interval = max(SENSOR_INTERVAL_SECONDS, target - RUN_PER_COMMIT_FLOOR_SECONDS)
        return min(BATCH_SNAPSHOT_RETENTION_HOURS, round(RUN_SNAPSHOT_BUDGET * interval / 3600, 2))
    return BATCH_SNAPSHOT_RETENTION_HOURS


def orphan_window_hours(spec: PipelineSpec) -> float:
    """The scheduled orphan window: 72 h for every pipeline, whatever its retention.

    A file is an orphan only once no commit will ever name it, and an iteration in flight
    (a stream catching up on a backlog on Spark, for hours) writes files no snapshot names yet:
    a window as short as a stream's retention would delete them before their commit, which
    would then reference missing files. Orphans are rare (an aborted commit deletes its own
    files), so a long window costs little (``maintain_table`` also raises it to twice the
    longest run recorded).

    Example:
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> base = {"name": "p", "topic": "t", "table": "n.t", "consumer_group_id": "g",
        ...     "value_format": "raw"}
        >>> orphan_window_hours(parse_pipeline_spec({**base, "freshness_target_seconds": 15}))
        72.0
    """
    return MAX_ORPHAN_WINDOW_HOURS


FREQUENT_MAINTENANCE_CRON = "7,22,37,52 * * * *"
"""Streams and pipelines with a freshness target: every 15 minutes (their retention is a commit
budget, hours or minutes; the history stays within 15 minutes of it), between the quarter hours
a fallback schedule ingests on by default."""
DAILY_MAINTENANCE_CRON = "7 3 * * *"
"""The other pipelines: daily at 03:07."""


def maintenance_cron(spec: PipelineSpec) -> str:
    """When the pipeline's maintenance runs: ``FREQUENT_MAINTENANCE_CRON`` for a stream or a
    pipeline with a freshness target, ``DAILY_MAINTENANCE_CRON`` otherwise. The pipelines on
    one cron are maintained in one run, one after the other (``maintenance_schedule``), so
    they never all compact at once.

    Example:
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> base = {"name": "orders", "topic": "t", "table": "n.t", "consumer_group_id": "g",
        ...     "value_format": "raw"}
        >>> maintenance_cron(parse_pipeline_spec({**base, "freshness_target_seconds": 15}))
        '7,22,37,52 * * * *'
        >>> maintenance_cron(parse_pipeline_spec({**base, "freshness_target_seconds": 300}))
        '7,22,37,52 * * * *'
        >>> maintenance_cron(parse_pipeline_spec(base))
        '7 3 * * *'
    """
    if is_continuous(spec) or spec.freshness_target_seconds is not None:
        return FREQUENT_MAINTENANCE_CRON
    return DAILY_MAINTENANCE_CRON
