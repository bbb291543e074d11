"""When a run's recorded process counts as dead: only provably gone on this host (unit level;
killed ``dagster job execute`` runs end to end: tests/platform_assets/cli/test_dead_runs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, instance_for_test

from platform_assets.ingest.jobs import count_active_runs
from platform_assets.ingest.liveness import (
    PROCESS_TAG,
    active_runs,
    death_evidence,
    process_identity,
)
from platform_assets.ingest.sensors import Busy
from platform_assets.pipelines import ingest_job_name
from tests.support.pipelines import make_spec


def test_a_live_process_is_alive_and_a_reaped_one_is_dead() -> None:
    assert death_evidence(json.dumps(process_identity())) is None  # this process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = process_identity(child.pid)
    child.wait()
    assert "is gone" in (death_evidence(json.dumps(identity)) or "")


def test_a_reused_pid_another_host_or_no_record_never_prove_death() -> None:
    here = process_identity()
    assert "another process" in (death_evidence(json.dumps({**here, "start": "1"})) or "")
    assert death_evidence(json.dumps({**here, "host": "elsewhere", "pid": 2**22 + 7})) is None
    assert death_evidence(json.dumps({**here, "boot_id": "other", "pid": 2**22 + 7})) is None
    assert death_evidence(None) is None
    assert death_evidence("not json") is None
    assert os.getpid() == here["pid"]


def test_the_sensors_count_fails_a_provably_dead_run_and_counts_a_live_one() -> None:
    """``count_active_runs`` (what the lag and stream sensors ask) marks a run whose process is
    gone failed, as Dagster's run monitoring would, and counts the others: one of this live
    process, one without the tag (which may be alive anywhere), and a re-execution that
    inherited the dead run's tag (Dagster copies a run's tags into its re-execution)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = process_identity(child.pid)
    child.wait()
    job = "ingest_liveness_job"
    with DagsterInstance.ephemeral() as instance:

        def add(identity: dict[str, str | int] | None, run_id: str | None = None) -> str:
            run = instance.add_run(DagsterRun(job_name=job, status=DagsterRunStatus.STARTED))
            if identity is not None:
                tag = {**identity, "run_id": run_id or run.run_id}
                instance.add_run_tags(run.run_id, {PROCESS_TAG: json.dumps(tag)})
            return run.run_id

        dead = add(gone)
        runs = {
            "dead": dead,
            "live": add(process_identity()),
            "untagged": add(None),
            "re-executed": add(gone, run_id=dead),
        }
        assert count_active_runs(instance, job) == 3
        status = {name: instance.get_run_by_id(run_id) for name, run_id in runs.items()}
        assert {name: run.status for name, run in status.items() if run} == {
            "dead": DagsterRunStatus.FAILURE,
            "live": DagsterRunStatus.STARTED,
            "untagged": DagsterRunStatus.STARTED,
            "re-executed": DagsterRunStatus.STARTED,
        }
        assert count_active_runs(instance, job) == 3  # nothing more to mark


def test_a_tag_of_another_run_or_another_pid_namespace_proves_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = {**process_identity(child.pid), "run_id": "r1"}
    child.wait()
    assert "is gone" in (death_evidence(json.dumps(gone), "r1") or "")
    assert death_evidence(json.dumps(gone), "r2") is None  # inherited by a re-execution
    assert death_evidence(json.dumps({**gone, "pid_ns": "other"}), "r1") is None


def test_a_canceling_run_counts_until_its_process_is_gone() -> None:
    """A run being terminated (CANCELING: ``make dev`` stopping, Terminate in the UI) may still
    commit until its process ends: the sensors count it as a STARTED one, and judge it as one,
    so a run killed while it stopped does not block its pipeline for ever."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = process_identity(child.pid)
    child.wait()
    spec = make_spec("orders", "canceling")
    job = ingest_job_name(spec)
    with instance_for_test() as instance:

        def canceling(identity: dict[str, str | int]) -> str:
            run = instance.add_run(DagsterRun(job_name=job, status=DagsterRunStatus.STARTED))
            tag = {**identity, "run_id": run.run_id}
            instance.add_run_tags(run.run_id, {PROCESS_TAG: json.dumps(tag)})
            instance.report_run_canceling(run, message="test: terminate")
            return run.run_id

        live = canceling(process_identity())
        assert count_active_runs(instance, job) == 1
        assert Busy.read(instance, [spec]).ingesting(instance, spec)  # the lag sensor waits
        dead = canceling(gone)
        judged = active_runs(instance, [job], [DagsterRunStatus.CANCELING])
        assert {run.run_id: run.dead is not None for run in judged} == {live: False, dead: True}
        assert count_active_runs(instance, job) == 1  # the dead one marked failed
        status = {run_id: instance.get_run_by_id(run_id) for run_id in (live, dead)}
        assert {run_id: run.status for run_id, run in status.items() if run} == {
            live: DagsterRunStatus.CANCELING,
            dead: DagsterRunStatus.FAILURE,
        }
        instance.report_run_canceled(status[live], message="test: ended")  # type: ignore[arg-type]
        assert count_active_runs(instance, job) == 0
        assert not Busy.read(instance, [spec]).ingesting(instance, spec)
