"""The metrics' figures from a pipeline's state (pure): lag per partition in records and
seconds, the last commit's duration, and the rates over the window."""

from __future__ import annotations

from ingestion.health.figures import in_window, pipeline_figures, table_records
from ingestion.health.state import Commit, PipelineState
from ingestion.kafka.topics import PartitionState, TopicState
from ingestion.table.offsets import RUN_DURATION_MS, CommittedState, TopicOffsets
from tests.support.pipelines import make_spec

NOW = 1_000_000_000


def commit(
    at_ms: int, records: int, dead: int = 0, properties: dict[str, str] | None = None
) -> Commit:
    return Commit(at_ms, at_ms, records, dead, {("t", 0): 5}, properties or {})


def state(commits: list[Commit], oldest: dict[tuple[str, int], int]) -> PipelineState:
    """Partition 0 caught up (5 of 5), partition 1 waiting (3 of 9)."""
    found = PipelineState(make_spec("t", "figures"), table_exists=True, commits=commits)
    found.committed = CommittedState(1, {"t": TopicOffsets("id", {0: 5, 1: 3})}, "c", "k")
    found.topics = [TopicState("t", "id", (PartitionState(0, 0, 5), PartitionState(1, 0, 9)))]
    found.oldest_uncommitted_ms = oldest
    return found


def test_lag_in_records_and_seconds_per_partition() -> None:
    figures = pipeline_figures(state([], {("t", 1): NOW - 42_000}), NOW)
    by_partition = {p.partition: p for p in figures.partitions}
    assert (by_partition[0].lag_records, by_partition[0].lag_seconds) == (0, 0.0)
    assert (by_partition[1].lag_records, by_partition[1].lag_seconds) == (6, 42.0)
    assert (by_partition[1].end, by_partition[1].committed) == (9, 3)
    assert figures.last_commit_ms is None
    assert figures.last_commit_duration_s is None


def test_a_future_timestamp_without_a_commit_has_no_age() -> None:
    """Unknown, never zero: a waiting partition must not look fresh (ingestion.health.lag)."""
    figures = pipeline_figures(state([], {("t", 1): NOW + 3_600_000}), NOW)
    assert [p.lag_seconds for p in figures.partitions] == [0.0, None]


def test_the_commit_duration_is_the_newest_ingestion_commits() -> None:
    """An operator action (a reset: no run duration) is the newest commit; the duration is the
    newest run's, the last commit time the action's."""
    commits = [
        commit(NOW - 1_000, 0),
        commit(NOW - 5_000, 10, properties={RUN_DURATION_MS: "3250"}),
        commit(NOW - 9_000, 10, properties={RUN_DURATION_MS: "9000"}),
    ]
    figures = pipeline_figures(state(commits, {}), NOW)
    assert figures.last_commit_duration_s == 3.25
    assert (figures.last_commit_ms, figures.last_commit_snapshot_id) == (NOW - 1_000, NOW - 1_000)


def test_the_rates_count_the_commits_inside_the_window() -> None:
    size = {"added-files-size": "1000"}
    commits = [
        commit(NOW - 10_000, 30, dead=2, properties=size),
        commit(NOW - 59_000, 20, dead=1, properties=size),
        commit(NOW - 60_000, 1_000, dead=50, properties=size),  # at the window's start: outside
    ]
    figures = pipeline_figures(state(commits, {}), NOW, window_s=60)
    assert (figures.window_commits, figures.window_records) == (2, 50)
    assert figures.records_per_second == 50 / 60
    assert figures.bytes_per_second == 2000 / 60
    assert figures.dead_letters_per_second == 3 / 60
    assert in_window(commits, NOW - 20_000, 60) == commits[1:]  # a commit after now: not yet


def test_table_records_reads_the_summary() -> None:
    assert table_records({"total-records": "7"}) == 7
    assert table_records({}) is None
