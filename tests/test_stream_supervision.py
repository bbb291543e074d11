"""The stream sensor's supervision on a real (ephemeral) Dagster instance: a stream whose
heartbeat stopped is marked failed; one from other definitions or a blocked pipeline is asked
to stop; a live one of the current definitions is left alone."""

from __future__ import annotations

import time

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from ingestion.spec import parse_pipeline_spec
from platform_assets.stream import (
    GENERATION_TAG,
    HEARTBEAT_TAG,
    STOP_TAG,
    seconds_since_failure,
    stream_job_name,
    supervise_streams,
)

SPEC = parse_pipeline_spec(
    {
        "name": "sup",
        "topic": "t",
        "table": "n.t",
        "consumer_group_id": "g",
        "value_format": "raw",
        "freshness_target_seconds": 15,
    }
)


def add_stream_run(instance: DagsterInstance, beat: float, generation: str) -> str:
    run = DagsterRun(
        job_name=stream_job_name(SPEC),
        status=DagsterRunStatus.STARTED,
        tags={HEARTBEAT_TAG: str(int(beat)), GENERATION_TAG: generation},
    )
    instance.add_run(run)
    return run.run_id


def test_dead_stream_is_failed_and_live_ones_are_kept_or_stopped() -> None:
    with DagsterInstance.ephemeral() as instance:
        now = time.time()
        dead = add_stream_run(instance, now - 600, "g1")
        live = add_stream_run(instance, now, "g1")
        assert supervise_streams(instance, SPEC, "g1", None)
        dead_run, live_run = instance.get_run_by_id(dead), instance.get_run_by_id(live)
        assert dead_run is not None
        assert live_run is not None
        assert dead_run.status == DagsterRunStatus.FAILURE
        assert STOP_TAG not in live_run.tags
        assert seconds_since_failure(instance, SPEC, time.time()) is None  # newest is live

        assert supervise_streams(instance, SPEC, "g2", None)  # the definitions were reloaded
        reloaded = instance.get_run_by_id(live)
        assert reloaded is not None
        assert "reloaded" in reloaded.tags[STOP_TAG]


def test_blocked_pipeline_stops_its_stream() -> None:
    with DagsterInstance.ephemeral() as instance:
        run_id = add_stream_run(instance, time.time(), "g1")
        supervise_streams(instance, SPEC, "g1", "blocked by group_id_consistency")
        run = instance.get_run_by_id(run_id)
        assert run is not None
        assert run.tags[STOP_TAG] == "blocked by group_id_consistency"
