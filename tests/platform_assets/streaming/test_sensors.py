"""The stream sensor's supervision on a real (ephemeral) Dagster instance: a stream whose
heartbeat stopped is marked failed; one from other definitions or a blocked pipeline is asked
to stop; a live one of the current definitions is left alone. A stream of a pipeline that no
longer streams is stopped by the definitions-wide ``stop_retired_streams``."""

from __future__ import annotations

import time

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, build_sensor_context

from ingestion.spec.pipeline import parse_pipeline_spec
from platform_assets.definitions import build_definitions
from platform_assets.streaming.jobs import (
    GENERATION_TAG,
    HEARTBEAT_TAG,
    STOP_TAG,
    seconds_since_failure,
    stream_job_name,
    stream_job_name_of,
    supervise_streams,
)
from platform_assets.streaming.sensors import stop_retired_streams
from tests.support.pipelines import make_spec

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


def add_run(instance: DagsterInstance, job_name: str, pipeline: str, beat: float) -> str:
    """A started run of ``job_name`` with the tags a launched stream run carries."""
    run = DagsterRun(
        job_name=job_name,
        status=DagsterRunStatus.STARTED,
        tags={"pipeline": pipeline, HEARTBEAT_TAG: str(int(beat)), GENERATION_TAG: "old"},
    )
    instance.add_run(run)
    return run.run_id


def test_streams_of_pipelines_that_no_longer_stream_are_stopped() -> None:
    """A removed pipeline's stream and one whose target was raised above the floor are asked to
    stop (a dead one is marked failed: nothing else would free its pool); the stream of a
    pipeline that still streams, and a removed pipeline's ingestion run, are left alone."""
    kept = make_spec("t_kept", "kept", freshness_target_seconds=15)
    slowed = make_spec("t_slowed", "slowed", freshness_target_seconds=600)
    with DagsterInstance.ephemeral() as instance:
        # Built inside the instance's context: Dagster resolves definitions against the current
        # instance's state storage (one left behind by another test may be disposed).
        sensor = build_definitions([kept, slowed]).resolve_sensor_def("stop_retired_streams")
        now = time.time()
        runs = {
            "kept": add_run(instance, stream_job_name(kept), "kept", now),
            "slowed": add_run(instance, stream_job_name(slowed), "slowed", now),
            "removed": add_run(instance, stream_job_name_of("removed"), "removed", now),
            "dead": add_run(instance, stream_job_name_of("dead"), "dead", now - 600),
            "ingest": add_run(instance, "ingest_removed_job", "removed", now),
        }
        tick = sensor.evaluate_tick(build_sensor_context(instance=instance))
        assert not tick.run_requests
        after = {name: instance.get_run_by_id(run_id) for name, run_id in runs.items()}
        for name in ("slowed", "removed"):
            run = after[name]
            assert run is not None
            assert "no longer streams" in run.tags[STOP_TAG], name
            assert run.status == DagsterRunStatus.STARTED  # it ends itself between commits
            assert run.run_id in (tick.skip_message or "")
        dead = after["dead"]
        assert dead is not None
        assert dead.status == DagsterRunStatus.FAILURE
        for name in ("kept", "ingest"):
            run = after[name]
            assert run is not None
            assert STOP_TAG not in run.tags, name
            assert run.status == DagsterRunStatus.STARTED

        again = sensor.evaluate_tick(build_sensor_context(instance=instance))
        assert (again.skip_message or "").startswith("asked earlier, still ending: ")  # once


def test_streams_of_another_code_location_are_left_alone() -> None:
    """Two code locations on one instance: a stream run launched by the other one is not a
    retired stream of this one, whatever this one's pipelines are."""
    from dagster._core.remote_origin import (
        RegisteredCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )

    def origin(location: str) -> RemoteJobOrigin:
        repository = RemoteRepositoryOrigin(
            RegisteredCodeLocationOrigin(location), "__repository__"
        )
        return RemoteJobOrigin(repository, stream_job_name_of("elsewhere"))

    with DagsterInstance.ephemeral() as instance:
        theirs, ours = (
            DagsterRun(
                job_name=stream_job_name_of("elsewhere"),
                status=DagsterRunStatus.STARTED,
                tags={"pipeline": "elsewhere", HEARTBEAT_TAG: str(int(time.time()))},
                remote_job_origin=origin(location),
            )
            for location in ("other", "platform")
        )
        instance.add_run(theirs)
        instance.add_run(ours)
        done, _ = stop_retired_streams(instance, set(), time.time(), "platform")
        assert len(done) == 1
        assert done[0].startswith(f"asked stream run {ours.run_id} to stop")
        left = instance.get_run_by_id(theirs.run_id)
        assert left is not None
        assert STOP_TAG not in left.tags
