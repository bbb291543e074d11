"""`make dev`'s stop (scripts/dev.py ``stop_daemon``): the daemon, the only launcher of runs, has
exited before the runs are canceled, whether ``dagster dev`` shuts it down, is gone already, or
leaves it running. The processes here are stand-ins with a daemon's command line (``python -c
... dagster._daemon``): what is judged is which process gets which signal and when, which a real
``dagster dev`` cannot be driven into on demand (a leader killed before its daemon); the real
stop runs in tests/scripts/test_dev.py and tests/scripts/test_dev_storage.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.scripts.test_dev_restart import load_dev_script
from tests.support.dev_stack import wait_for

DAEMON = "import time\nwhile True: time.sleep(0.1)"  # stops on SIGINT (KeyboardInterrupt)
STUBBORN = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + DAEMON  # SIGKILL only


def leader(script: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """A process group whose leader runs ``script``, which starts a daemon stand-in in its group
    and writes its pid to the file named by its first argument."""
    return subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "daemon.pid")],
        start_new_session=True,
    )


SPAWN = """
import subprocess, sys
daemon = subprocess.Popen([sys.executable, "-c", {code!r}, "dagster._daemon", "run"])
open(sys.argv[1], "w").write(str(daemon.pid))
{then}
"""


def daemon_of(group: subprocess.Popen[bytes], tmp_path: Path) -> int:
    pid_file = tmp_path / "daemon.pid"
    wait_for("the daemon stand-in", lambda: pid_file.exists() and pid_file.read_text(), 30, 0.1)
    dev = load_dev_script()
    pid = int(pid_file.read_text())
    wait_for("its command line", lambda: dev.is_daemon(pid), 30, 0.1)
    return pid


def test_a_leader_that_shuts_its_daemon_down_is_waited_for(tmp_path: Path) -> None:
    """As ``dagster dev`` on Ctrl-C: the leader alone is interrupted and stops its daemon."""
    then = (
        "import signal, time\n"
        "try:\n    daemon.wait()\n"
        "except KeyboardInterrupt:\n    daemon.send_signal(signal.SIGINT); daemon.wait()\n"
        "    time.sleep(30)"  # the leader itself lingers: only the daemon is waited for
    )
    group = leader(SPAWN.format(code=DAEMON, then=then), tmp_path)
    try:
        pid = daemon_of(group, tmp_path)
        dev = load_dev_script()
        started = time.monotonic()
        dev.stop_daemon(group, timeout_s=30)
        assert not dev.is_daemon(pid)
        assert time.monotonic() - started < 5  # not the 5 s nudge: the leader did it
        assert group.poll() is None  # the rest of the group is left to stop_process_group
    finally:
        load_dev_script().stop_process_group(group)


def test_a_daemon_whose_leader_is_gone_is_interrupted_itself(tmp_path: Path) -> None:
    group = leader(SPAWN.format(code=DAEMON, then="pass"), tmp_path)  # the leader exits at once
    try:
        pid = daemon_of(group, tmp_path)
        group.wait(30)
        dev = load_dev_script()
        started = time.monotonic()
        dev.stop_daemon(group, timeout_s=30)
        assert not dev.is_daemon(pid)
        assert time.monotonic() - started < 5  # at once: no leader to wait for
    finally:
        load_dev_script().stop_process_group(group)


def test_a_daemon_that_ignores_interrupts_is_killed_at_the_deadline(tmp_path: Path) -> None:
    group = leader(SPAWN.format(code=STUBBORN, then="import time; time.sleep(60)"), tmp_path)
    try:
        pid = daemon_of(group, tmp_path)
        dev = load_dev_script()
        started = time.monotonic()
        dev.stop_daemon(group, timeout_s=6)
        waited = time.monotonic() - started
        wait_for("the killed daemon to be gone", lambda: not dev.is_daemon(pid), 10, 0.1)
        assert 6 <= waited < 15, waited
    finally:
        load_dev_script().stop_process_group(group)
