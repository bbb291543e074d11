"""Runs killed hard (SIGKILL, an OOM kill) stay STARTED in Dagster for ever; operator actions
must not be refused by them for good, but a run that may be alive still blocks them (R48).
Each run is a real ``dagster job execute`` of the pipeline's ingest job in its own process,
on the session's broker and catalog; the actions go through the ``platform`` CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from platform_assets.cli.main import main
from platform_assets.ingest.liveness import PROCESS_TAG
from resources.iceberg import IcebergCatalogResource
from tests.support.dagster_runs import job_execute_setup
from tests.support.pipelines import Harness, NewPipeline

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


def test_a_killed_run_stops_blocking_actions_and_a_live_one_still_blocks(
    tmp_path: Path,
    harness: Harness,
    catalog_resource: IcebergCatalogResource,
    new_pipeline: NewPipeline,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, spec = new_pipeline(
        "dead_runs",
        partitions=2,
        produce=20_000,
        in_process_max_records=100_000,
        max_records_per_task=100_000,
    )
    harness.run(spec.model_copy(update={"max_records_per_run": 10}))  # the table exists
    env, command = job_execute_setup(
        tmp_path, spec, harness.kafka.bootstrap_servers, catalog_resource.state_dir
    )
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    home = env["DAGSTER_HOME"]

    def start_and_stop() -> tuple[subprocess.Popen[bytes], str]:
        """A run stopped (SIGSTOP) once its step recorded its process (without the tag: 1 s
        after it STARTED)."""
        known = {r.run_id for r in instance.get_runs()}
        with (tmp_path / "runs.log").open("ab") as log:
            # Not the repository root: a running make dev's .env there would redirect it.
            process = subprocess.Popen(
                command,
                cwd=tmp_path,
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline, started_at = time.monotonic() + 120, None
        while time.monotonic() < deadline:
            runs = [r for r in instance.get_runs() if r.run_id not in known]
            if runs and PROCESS_TAG in runs[0].tags:
                break
            if runs and runs[0].status == DagsterRunStatus.STARTED:  # code without the tag
                started_at = started_at or time.monotonic()
                if time.monotonic() - started_at > 1.0:
                    break
            time.sleep(0.02)
        os.killpg(process.pid, signal.SIGSTOP)
        runs = [r for r in instance.get_runs() if r.run_id not in known]
        if len(runs) != 1 or runs[0].status != DagsterRunStatus.STARTED:
            os.killpg(process.pid, signal.SIGKILL)  # leave no stopped process behind
            process.wait(30)
        assert [r.status for r in runs] == [DagsterRunStatus.STARTED], [r.tags for r in runs]
        return process, runs[0].run_id

    def reset() -> int:
        return main(["reset", spec.name, "--to", "earliest", "--apply", "--reason", "test"])

    with DagsterInstance.from_config(home) as instance:
        live, live_id = start_and_stop()
        try:  # a live run (stopped, not dead) blocks, named
            with pytest.raises(SystemExit) as refused:
                reset()
            assert live_id in str(refused.value)
            assert f"platform clear-dead-runs {spec.name}" in str(refused.value)
        finally:
            os.killpg(live.pid, signal.SIGKILL)
            live.wait(30)
        # killed: Dagster still shows it STARTED, the action proceeds and says what it ignored
        active = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
        assert [r.run_id for r in active] == [live_id]
        assert reset() == 0
        out = capsys.readouterr().out
        assert f"ignored 1 run(s) whose process is gone (run {live_id}" in out

        second, second_id = start_and_stop()
        os.killpg(second.pid, signal.SIGKILL)
        second.wait(30)
        assert main(["clear-dead-runs", "--apply", spec.name]) == 0
        out = capsys.readouterr().out
        assert out.count("marked failed: run ") == 2
        assert second_id in out
        assert not instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
        assert (
            main(["migrate-group", "--apply", spec.name, "group-dead-runs-2", "--reason", "t"]) == 0
        )
