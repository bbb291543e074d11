"""Is an ingestion run that Dagster still shows as active really alive? Only a run whose process
is provably gone counts as dead; every other run keeps blocking operator actions.

A run stays STARTED (or CANCELING, once its termination was requested) for ever when its
process is SIGKILLed or OOM-killed: without the daemon's run monitoring (which, with the
DefaultRunLauncher, cannot check a run worker's health either) nothing marks it failed, and
every operator action would refuse for good. So each ingestion run
records, as soon as its step starts, where it runs (``PROCESS_TAG``): host name, kernel boot id,
PID namespace, pid and the process's start time. A run is dead when all of these hold, checked
on the machine of the caller:

- same host name, same boot id and same PID namespace: the pid means the same process table
  (a reboot, another machine or another container is never judged: the run blocks);
- no process has that pid, or the process with it started at another time (the pid was reused),
  or it is a zombie (killed, not yet reaped: it runs no code).

A run without the tag (killed before its step started, or launched by an older version), or on
another host, is never called dead: it blocks, and the refusal names it with the command that
clears it once the operator knows it is gone. A run that is alive, even stopped (SIGSTOP), keeps
its process and blocks.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter

PROCESS_TAG = "platform/run-process"  # where the run's process runs: see the module docstring

# The statuses of a run whose own process runs (or ran) its steps: only these are judged. A run
# is CANCELING from the request to terminate it until its process ends (a stream worker stops
# its lanes between commits, up to its stop timeout): it may still commit, so it counts as in
# progress as Dagster counts it, and it is dead once its process is provably gone.
RUNNING_STATUSES = (DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of process ``pid``; None when no process
    has that pid. Raises OSError when /proc cannot tell (another OS)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    return fields[0], fields[19]  # field 22: starttime


def process_identity(pid: int | None = None) -> dict[str, str | int]:
    """Where process ``pid`` (this one by default) runs, as ``PROCESS_TAG`` records it."""
    pid = os.getpid() if pid is None else pid
    stat = _stat(pid) if Path("/proc").is_dir() else None
    return {
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "pid_ns": _pid_namespace(),
        "pid": pid,
        "start": stat[1] if stat else "",
    }


def record_run_process(instance: DagsterInstance, run_id: str) -> None:
    """Tag run ``run_id`` with this process's identity and the run's id. Call it only from a
    step that runs in the run's own process (an in-process executor): a step in a child
    process would name the child, which may end while the run goes on. The run id matters
    because Dagster copies a run's tags into its re-execution and retries: an inherited tag
    names another run's process and proves nothing."""
    identity = {**process_identity(), "run_id": run_id}
    instance.add_run_tags(run_id, {PROCESS_TAG: json.dumps(identity, sort_keys=True)})


def death_evidence(tag: str | None, run_id: str | None = None) -> str | None:
    """Why the process a run's ``PROCESS_TAG`` names is provably gone; None when it may be alive
    (no tag, a tag of another run than ``run_id``, another host, boot or PID namespace, no
    /proc, or the process is there, also when /proc hides it from this user)."""
    if not tag:
        return None
    try:
        recorded = json.loads(tag)
        pid, start = int(recorded["pid"]), str(recorded["start"])
    except (ValueError, KeyError, TypeError):
        return None
    if run_id is not None and recorded.get("run_id") != run_id:
        return None  # inherited by a re-execution or retry: it names another run's process
    here = process_identity()
    same = all(recorded.get(k) == here[k] and here[k] for k in ("host", "boot_id", "pid_ns"))
    if not same or not start:
        return None
    try:
        stat = _stat(pid)
    except OSError:
        return None
    if stat is None:
        try:  # /proc mounted hidepid hides other users' processes: ask the kernel itself
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"process {pid} on {here['host']} is gone"
        except PermissionError:
            return None  # it exists, under another user
        return None
    state, started = stat
    if started != start:
        return f"process {pid} on {here['host']} is gone (the pid now belongs to another process)"
    if state in ("Z", "X"):
        return f"process {pid} on {here['host']} was killed (a zombie, not yet reaped)"
    return None


@dataclass(frozen=True)
class ActiveRun:
    """A run Dagster shows as queued or in progress, and whether its process is provably gone."""

    run_id: str
    job_name: str
    status: str
    started: float | None  # epoch seconds, None before it started
    dead: str | None  # the evidence that its process is gone, None when it may be alive
    assets: AbstractSet[AssetKey] | None = None  # the assets it selected; None: all of its job's

    def describe(self) -> str:
        """``run <id> (job <job>, STARTED at <time>)``, plus the evidence when dead."""
        when = (
            dt.datetime.fromtimestamp(self.started, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            if self.started
            else "not started yet"
        )
        text = f"run {self.run_id} (job {self.job_name}, {self.status} since {when})"
        return f"{text}: dead, {self.dead}" if self.dead else text


def active_runs(
    instance: DagsterInstance, job_names: list[str], statuses: list[object]
) -> list[ActiveRun]:
    """The runs of ``job_names`` in ``statuses``, each judged alive or provably dead."""
    wanted = set(job_names)
    # One query: by job for one job's runs (the usual case), else every active run, filtered
    # here (the lag sensor's pass over every pipeline).
    only = next(iter(wanted)) if len(wanted) == 1 else None
    records = instance.get_run_records(RunsFilter(job_name=only, statuses=statuses))  # type: ignore[arg-type]
    return [
        ActiveRun(
            run.run_id,
            run.job_name,
            run.status.value,
            record.start_time,
            # Only a STARTED or CANCELING run is judged: one queued or starting has no process
            # of its own yet (a tag it carries was inherited).
            death_evidence(run.tags.get(PROCESS_TAG), run.run_id)
            if run.status in RUNNING_STATUSES
            else None,
            run.asset_selection,
        )
        for record in records
        if (run := record.dagster_run).job_name in wanted
    ]


def clear_dead_runs(
    instance: DagsterInstance, runs: list[ActiveRun], by: str = "`platform clear-dead-runs`"
) -> list[ActiveRun]:
    """Mark the provably dead ``runs`` failed in the instance (the others are left alone),
    saying ``by`` whom; return those marked. A CANCELING one too: its process died before it
    could end the run (killed while it stopped)."""
    cleared = []
    for run in runs:
        dagster_run = instance.get_run_by_id(run.run_id) if run.dead else None
        if dagster_run is None or dagster_run.is_finished:
            continue
        instance.report_run_failed(
            dagster_run,
            f"marked failed by {by}: its {run.dead} (SIGKILL or OOM kill)",
        )
        cleared.append(run)
    return cleared
