"""Produce -> queryable latency read from a table: each record's Kafka timestamp against the
commit time of the snapshot whose offsets first cover it (scripts/freshness.py, the test)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingestion.health.state import commits_of

if TYPE_CHECKING:
    from pyiceberg.table import Table


@dataclass
class Latency:
    """Percentiles of produce -> queryable over the records of a window, and the commits."""

    records: int
    p50_s: float
    p95_s: float
    max_s: float
    commits: int
    commit_interval_s: float

    def line(self) -> str:
        """One line for a terminal or the docs (docs/freshness.md)."""
        return (
            f"{self.records} records: produce->queryable p50 {self.p50_s:.1f} s, "
            f"p95 {self.p95_s:.1f} s, max {self.max_s:.1f} s; {self.commits} commits, one "
            f"every {self.commit_interval_s:.1f} s"
        )


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank.

    Example:
        >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5)
        2.0
        >>> percentile([1.0, 2.0, 3.0, 4.0], 0.95)
        4.0
    """
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(q * len(ordered) + 0.999999) - 1))
    return ordered[rank]


def measure_latency(table: Table, group_id: str, since_ms: int, until_ms: int) -> Latency:
    """Latency of the records produced in ``[since_ms, until_ms)`` that the table holds.

    A record's latency is the commit time of the first snapshot of ``group_id`` whose offsets
    for its partition are above its offset, minus its Kafka timestamp.
    """
    commits = sorted(commits_of(table, group_id, limit=100_000), key=lambda c: c.timestamp_ms)
    by_key: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for commit in commits:
        for key, offset in commit.offsets.items():
            offsets, times = by_key.setdefault(key, ([], []))
            offsets.append(offset)
            times.append(commit.timestamp_ms)
    rows = table.scan(
        selected_fields=("_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp")
    ).to_arrow()
    stamps = [int(t.timestamp() * 1000) for t in rows.column("_kafka_timestamp").to_pylist()]
    latencies = []
    for topic, partition, offset, stamp in zip(
        rows.column("_kafka_topic").to_pylist(),
        rows.column("_kafka_partition").to_pylist(),
        rows.column("_kafka_offset").to_pylist(),
        stamps,
        strict=True,
    ):
        if not since_ms <= stamp < until_ms:
            continue
        offsets, times = by_key[(topic, partition)]
        first = bisect.bisect_right(offsets, offset)  # offsets are "next offset": > offset
        latencies.append((times[first] - stamp) / 1000)
    window = [c.timestamp_ms for c in commits if since_ms <= c.timestamp_ms < until_ms]
    interval = (window[-1] - window[0]) / 1000 / (len(window) - 1) if len(window) > 1 else 0.0
    if not latencies:
        return Latency(0, 0.0, 0.0, 0.0, len(window), interval)
    return Latency(
        records=len(latencies),
        p50_s=percentile(latencies, 0.5),
        p95_s=percentile(latencies, 0.95),
        max_s=max(latencies),
        commits=len(window),
        commit_interval_s=interval,
    )
