"""What a commit costs as the table's history grows (why streams expire often, docs/operate.md).

    .venv/bin/python bench/snapshot_cost.py [--snapshots 20 250 500 1000]

Path: pyiceberg directly on a throw-away SQL catalog (SQLite, local warehouse), no Kafka: each
commit is ``load_table`` then a one-row ``fast_append`` carrying the properties of a stream commit
of an 8-partition topic (``ingestion.table.offsets.commit_properties``), as a stream iteration
commits. Printed at each history size: the median of the last 20 commits and the size of the
metadata file every commit rewrites. Nothing is expired, so the history is the commit count.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

from ingestion.table.offsets import TopicOffsets, commit_properties


def measure(sizes: list[int], partitions: int = 8) -> list[tuple[int, float, int]]:
    """(history size, median commit seconds of the last 20, metadata bytes) at each size."""
    folder = Path(tempfile.mkdtemp(prefix="snapshot-cost-"))
    catalog = SqlCatalog(
        "bench", uri=f"sqlite:///{folder}/catalog.db", warehouse=f"file://{folder}/warehouse"
    )
    catalog.create_namespace("bench")
    row = pa.table({"id": pa.array([1], pa.int64()), "payload": pa.array(["x"])})
    catalog.create_table("bench.history", row.schema)
    topic_id, durations, figures = str(uuid.uuid4()), [], []
    for count in range(1, max(sizes) + 1):
        offsets = {
            "orders": TopicOffsets(topic_id, {p: count * 100 + p for p in range(partitions)})
        }
        properties = commit_properties(
            group_id="platform-orders",
            offsets=offsets,
            commit_id=str(uuid.uuid4()),
            cluster_id="bench-cluster",
            pipeline="orders",
            records=7600,
            run_id=str(uuid.uuid4()),
            valid_through_ms=int(time.time() * 1000),
            run_duration_ms=900,
        )
        started = time.perf_counter()
        table = catalog.load_table("bench.history")
        table.append(row, snapshot_properties=properties)
        durations.append(time.perf_counter() - started)
        if count in sizes:
            size = Path(table.metadata_location.removeprefix("file://")).stat().st_size
            figures.append((count, statistics.median(durations[-20:]), size))
    return figures


def main() -> None:
    """Print one line per history size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshots", type=int, nargs="+", default=[20, 250, 500, 1000])
    args = parser.parse_args()
    for count, median_s, size in measure(sorted(args.snapshots)):
        print(
            f"{count} snapshots: commit p50 {median_s * 1000:.0f} ms, metadata {size / 1e6:.2f} MB",
            flush=True,
        )


if __name__ == "__main__":
    main()
