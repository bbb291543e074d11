"""The benchmark commands of bench/README.md run, at a size a test can afford (the figures are
not judged: performance lives in the benchmarks, never in timed tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PROJECT = Path(__file__).resolve().parents[2]


def run_bench(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=PROJECT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-5000:])
    return done.stdout


def test_ingest_1m_reports_the_oracle() -> None:
    out = run_bench("bench/ingest_1m.py", "--records", "2000")
    assert "ingested 2,000 records, 0 quarantined" in out
    assert "oracle: OK (2000 rows, 0 quarantined)" in out


def test_run_prints_and_writes_every_figure(tmp_path: Path) -> None:
    target = tmp_path / "figures.json"
    out = run_bench(
        "bench/run.py",
        "--records",
        "3000",
        "--freshness-seconds",
        "5",
        "--sensor-interval",
        "1",
        "--json",
        str(target),
    )
    figures = json.loads(target.read_text())
    assert figures["records"] == 3000
    assert set(figures["limit_per_s"]) == {"1", "2"}
    assert figures["baseline_per_s"] > 0
    assert [(r["slots"], r["records"]) for r in figures["ours"]] == [(1, 3000), (2, 3000)]
    assert all(r["records_per_s"] > 0 and r["files"] >= 1 for r in figures["ours"])
    assert figures["freshness"]["runs"] >= 1
    assert figures["freshness"]["sensor_interval_s"] == 1
    assert figures["profile_top"]
    for line in ("limit local[2]", "baseline (1 process)", "ours local[2]", "freshness"):
        assert line in out


@pytest.fixture(scope="module")
def all_suite(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    """One ``--suite all`` run (the dirty workloads, then the nested ones, one process, one
    broker): its output and its rows, each read back by the bench."""
    target = tmp_path_factory.mktemp("bench-all") / "all.json"
    out = run_bench(
        "bench/run.py",
        "--suite",
        "all",
        "--records",
        "600",
        "--repeats",
        "1",
        "--json",
        str(target),
    )
    return out, json.loads(target.read_text())["dirty"]


def test_dirty_suite_prints_every_workload_against_clean(
    all_suite: tuple[str, list[dict[str, Any]]],
) -> None:
    """Counts are exact for every workload (quarantined = bad records made, nothing lost); the
    ratios are printed, not judged, at this size."""
    from bench.dirty import WORKLOADS

    out, rows = all_suite
    results = rows[: len(WORKLOADS)]
    assert [r["workload"] for r in results] == [w.name for w in WORKLOADS]
    for r in results:
        assert (r["records"], r["quarantined"]) == (600, r["expected_bad"]), r
        assert r["read_back"] == [600 - r["expected_bad"], r["expected_bad"], True], r
    assert "COUNT-MISMATCH" not in out
    assert "spread 30 days" in out
    assert sum(r["expected_bad"] for r in results) > 0
    assert "malformed 10.0%" in out


def test_nested_suite_prints_nested_and_headers_against_flat(
    all_suite: tuple[str, list[dict[str, Any]]],
) -> None:
    """Every nested and headers workload lands every record; the ratios and the profile of the
    nested path are printed (not judged at this size)."""
    from bench.dirty import WORKLOADS as DIRTY
    from bench.nested import WORKLOADS

    out, rows = all_suite
    results = rows[len(DIRTY) :]
    assert [r["workload"] for r in results] == [w.name for w in WORKLOADS]
    assert all((r["landed"], r["quarantined"]) == (600, 0) for r in results), results
    assert all(r["read_back"] == [600, 0, True] for r in results), results
    assert "COUNT-MISMATCH" not in out
    assert "in-process nested run: 600 records" in out


def test_dirty_table_fails_on_a_wrong_count() -> None:
    """The dirty and nested suites' exit status: a row whose counts or read back are off."""
    from bench.dirty import print_dirty_table

    row = {
        "workload": "clean",
        "produced": 10,
        "records": 10,
        "quarantined": 1,
        "expected_bad": 1,
        "read_back": [9, 1, True],
        "seconds": 1.0,
        "records_per_s": 10,
        "target": None,
    }
    assert print_dirty_table([row])
    assert not print_dirty_table([row, {**row, "workload": "x", "quarantined": 0}])
    assert not print_dirty_table([row, {**row, "workload": "x", "read_back": [9, 1, False]}])


def test_late_copies_suite_skips_each_late_copy_and_lands_the_near_miss(tmp_path: Path) -> None:
    """R54's guard, routes set up by a real ``--source-lost`` failover on two brokers: every run
    is exact (the bench checks its counts and reads each table back), the late-copies case
    skipped its two copies and landed its near miss; the ratios are not judged at this size."""
    target = tmp_path / "late-copies.json"
    out = run_bench(
        "bench/run.py",
        "--suite",
        "late-copies",
        "--records",
        "300",
        "--repeats",
        "1",
        "--uncopied",
        "20",
        "50",
        "--late-copies",
        "2",
        "--json",
        str(target),
    )
    cases = json.loads(target.read_text())["cases"]
    assert [c["case"] for c in cases] == ["plain", "guarded 20", "guarded 50", "late copies"]
    assert [c["uncopied"] for c in cases] == [0, 20, 50, 20]
    assert all(c["runs_exact"] and c["read_back"] == "ok" for c in cases), cases
    assert [(c["records"], c["late_copies"]) for c in cases] == [(300, 0)] * 3 + [(301, 2)]
    assert "COUNT-MISMATCH" not in out
    assert "x plain" in out


def test_late_copies_table_fails_on_a_wrong_count() -> None:
    """The suite's exit status: a case whose runs or table read back are off is a failure."""
    from bench.late_copies import print_late_copy_table

    row = {
        "case": "plain",
        "uncopied": 0,
        "records": 10,
        "late_copies": 0,
        "seconds": 1.0,
        "records_per_s": 10,
        "ratio": 1.0,
        "runs_exact": True,
        "read_back": "ok",
    }
    assert print_late_copy_table([row])
    assert not print_late_copy_table([row, {**row, "case": "late copies", "runs_exact": False}])
    assert not print_late_copy_table([row, {**row, "case": "guarded", "read_back": "9 rows"}])


def test_small_runs_compares_both_modes() -> None:
    out = run_bench("bench/small_runs.py", "--runs", "1", "--records", "50")
    assert "in-process / spark wall time:" in out
    assert {line.split()[0] for line in out.splitlines()[1:3]} == {"spark", "driver"}


def test_writer_compares_workloads_and_task_memory(tmp_path: Path) -> None:
    target = tmp_path / "writer.json"
    out = run_bench(
        "bench/writer.py",
        "--records",
        "2000",
        "--small-task",
        "500",
        "--large-task",
        "2000",
        "--rounds",
        "1",
        "--json",
        str(target),
    )
    figures = json.loads(target.read_text())
    assert set(figures["workloads"]) == {"one_partition", "spread_30d"}
    assert figures["workloads"]["spread_30d"]["files"] == 2 * 30  # one per day per task
    assert figures["workloads"]["one_partition"]["files"] == 2
    assert [(r["slots"], r["per_task"]) for r in figures["rss"]] == [
        (1, 500),
        (1, 2000),
        (2, 500),
        (2, 2000),
    ]
    assert all(r["records"] == 2000 and r["workers_rss_mb"] > 0 for r in figures["rss"])
    assert {name: run["records"] for name, run in figures["sort_order"].items()} == {
        "unsorted": 2000,
        "sorted": 2000,
    }
    for line in ("spread_30d", "one_partition", "sort order", "workers peak RSS", "local[2]"):
        assert line in out


def test_upsert_compares_with_append_and_many_commits(tmp_path: Path) -> None:
    """bench/upsert.py at toy sizes: both modes read every change; both tables after the
    commits equal the source (the bench asserts it) and maintenance expired snapshots."""
    target = tmp_path / "upsert.json"
    out = run_bench(
        "bench/upsert.py",
        "--keys",
        "300",
        "--changes",
        "600",
        "--cap",
        "300",
        "--commits",
        "4",
        "--per-commit",
        "5",
        "--maintain-every",
        "2",
        "--json",
        str(target),
    )
    figures = json.loads(target.read_text())
    throughput = figures["throughput"]
    assert throughput["append"]["records"] == throughput["upsert"]["records"] == 600
    assert throughput["upsert"]["updates"] > 0
    commits = figures["commits"]
    assert commits["plain"]["rows"] == commits["kept"]["rows"]
    assert commits["kept"]["snapshots"] < commits["plain"]["snapshots"]
    for line in ("change phase", "after 4 commits", "run time per commit"):
        assert line in out


def test_snapshot_cost_prints_each_history_size() -> None:
    out = run_bench("bench/snapshot_cost.py", "--snapshots", "3", "6")
    lines = out.strip().splitlines()
    assert [line.split(" ")[0] for line in lines] == ["3", "6"]
    assert all("commit p50" in line and "MB" in line for line in lines)


def test_parts_prints_start_time_and_memory_of_a_part(tmp_path: Path) -> None:
    target = tmp_path / "parts.json"
    out = run_bench("bench/parts.py", "--repeats", "1", "--only", "kafka", "--json", str(target))
    (figures,) = json.loads(target.read_text()).values()
    assert figures["start_s"] > 0
    assert figures["rss_mib"] > 50  # a JVM broker, not an empty process group
    assert "kafka broker (Apache Kafka 4.4, KRaft)" in out


def test_many_pipelines_writes_n_streaming_copies_of_the_demo(tmp_path: Path) -> None:
    """bench/many_pipelines.py's pipelines file (the benchmark itself runs `make dev` for
    minutes per count: hand-run only): N valid, streaming copies of the shipped pipeline, each
    on its own topic, table and group, so that N of them share one stream worker."""
    from bench.many_pipelines import write_pipelines
    from ingestion.health.triggers import is_continuous
    from ingestion.spec.pipeline import load_pipeline_specs
    from platform_assets.streaming.jobs import shard_of

    path, names = write_pipelines(tmp_path, 12)
    specs = load_pipeline_specs(path)
    assert [s.name for s in specs] == names
    assert all(is_continuous(s) and s.in_process_max_records == 0 for s in specs)
    assert len({(s.source_topics[0], s.table, s.consumer_group_id) for s in specs}) == 12
    assert {shard_of(s.name, 1) for s in specs} == {0}


def test_many_pipelines_names_each_process_and_sums_a_profile_by_function(tmp_path: Path) -> None:
    """The benchmark's CPU table names each process of the stack by what it is, and its
    profile summary counts each function once per stack (whatever its line), as a share of
    py-spy's busy samples."""
    import os

    import psutil

    from bench.many_pipelines import kind_of, summarize_profile

    assert kind_of(psutil.Process(os.getpid())) in ("pytest", "python -c", "python -m pytest")
    collapsed = tmp_path / "worker.txt"
    collapsed.write_text(
        "main (x.py:1);run_pipeline (ingestion/pipeline/run.py:10);"
        "run_pipeline (ingestion/pipeline/run.py:20) 3\n"
        "main (x.py:1);commit (pyiceberg/table/__init__.py:5) 1\n"
    )
    assert summarize_profile(collapsed) == [
        " 75.0%  run_pipeline (ingestion/pipeline/run.py)",
        " 25.0%  commit (pyiceberg/table/__init__.py)",
    ]
