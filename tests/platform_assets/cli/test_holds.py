"""A state-changing CLI command holds a streaming pipeline as the operator jobs do, instead of
racing its commits: ``platform reset --apply`` on the session's broker and catalog, with a
Dagster instance in which a stream worker run serves the pipeline.

The worker is its run record (STARTED, beating, serving the pipeline), as the stream sensor and
``hold_ingestion`` read it; the test plays the worker's part by ending the lane (its
``stream/serving`` tag) once the hold appears. The lane itself stopping on a hold is
tests/platform_assets/streaming/test_jobs.py's."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance

from ingestion.table.offsets import find_committed_state
from platform_assets.cli.actions import CLI_ACTION_JOB
from platform_assets.cli.main import main
from platform_assets.ingest.jobs import operator_holds
from platform_assets.streaming.jobs import (
    SERVING_TAG,
    dump_tag_map,
)
from resources.iceberg import IcebergCatalogResource
from tests.support.dagster_runs import add_serving_worker, job_execute_setup
from tests.support.pipelines import Harness, NewPipeline

pytestmark = pytest.mark.integration


def test_a_cli_reset_holds_a_streaming_pipeline_instead_of_racing_it(
    tmp_path: Path,
    harness: Harness,
    catalog_resource: IcebergCatalogResource,
    new_pipeline: NewPipeline,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic, spec = new_pipeline("cli_hold", produce=20)
    harness.run(spec, use_spark=False)
    env, _ = job_execute_setup(
        tmp_path, spec, harness.kafka.bootstrap_servers, catalog_resource.state_dir
    )
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    outcome: dict[str, int] = {}

    def reset() -> None:
        outcome["exit"] = main(
            ["reset", spec.name, "--to", "earliest", "--apply", "--reason", "test"]
        )

    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        worker = add_serving_worker(instance, spec)
        command = threading.Thread(target=reset, daemon=True)
        command.start()
        deadline = time.monotonic() + 60
        while not operator_holds(instance, [spec.name]) and time.monotonic() < deadline:
            time.sleep(0.1)
        record = operator_holds(instance, [spec.name])[spec.name]
        found = instance.get_run_by_id(record)
        assert found is not None
        assert found.job_name == CLI_ACTION_JOB
        time.sleep(1.5)
        assert command.is_alive(), "the command waits for the lane to stop"
        assert "exit" not in outcome
        instance.add_run_tags(worker.run_id, {SERVING_TAG: dump_tag_map({})})  # lane stopped
        command.join(60)
        assert outcome == {"exit": 0}
        assert instance.get_run_by_id(record) is None, "the record ends with the command"
        assert not operator_holds(instance, [spec.name])  # the lane may start again
    assert "held it while acting" in capsys.readouterr().out
    state = find_committed_state(harness.table(spec), spec.consumer_group_id)
    assert state is not None
    assert state.offsets[topic].next_offsets == {0: 0}  # reset to the earliest offset
