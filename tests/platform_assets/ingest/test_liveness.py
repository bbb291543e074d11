"""When a run's recorded process counts as dead: only provably gone on this host (unit level;
killed ``dagster job execute`` runs end to end: tests/platform_assets/cli/test_dead_runs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from platform_assets.ingest.liveness import death_evidence, process_identity


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
