"""A server process the platform starts for itself (``ManagedProcess``), with small real Python
servers: it serves once its port accepts connections, an early exit is reported with its code,
its output goes to its log, and stopping it ends the whole process group (SIGKILL after the
timeout when it ignores its stop signal, and children that outlived their parent)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Self

import pytest

from resources.process import ManagedProcess

SERVE = """
import signal, socket, subprocess, sys, time
port, ignore_term, child = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
if ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if child:  # a child in the same group that ignores SIGTERM and outlives its parent
    kid = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    print("child", kid.pid, flush=True)
server = socket.socket()
server.bind(("127.0.0.1", port))
server.listen()
print("serving", port, flush=True)
time.sleep(60)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server(ManagedProcess):
    """A Python server on a free port; ``ignore_term``: it ignores SIGTERM; ``child``: it
    starts a child that does."""

    def __init__(self, log_path: Path, ignore_term: bool = False, child: bool = False) -> None:
        self.log_path, self.port = log_path, free_port()
        self.flags = ["1" if ignore_term else "0", "1" if child else "0"]
        self.stop_timeout_s = 0.5

    def start(self) -> Self:
        self.spawn([sys.executable, "-c", SERVE, str(self.port), *self.flags])
        assert self.wait_listening(self.port, timeout_s=10), self.read_log()
        return self


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def gone(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_server_serves_logs_and_stops_with_its_block(tmp_path: Path) -> None:
    with Server(tmp_path / "logs" / "server.log") as server:
        pid = server.pid
        assert pid is not None
        assert f"serving {server.port}" in server.read_log()
        assert server.read_log(max_chars=4) == server.read_log()[-4:]
    assert server.pid is None
    assert gone(pid)
    server.stop()  # stopping again is a no-op


def test_a_process_that_exits_before_serving_is_reported_with_its_code(tmp_path: Path) -> None:
    process = Server(tmp_path / "early.log")
    process.spawn([sys.executable, "-c", "import sys; print('bad config'); sys.exit(3)"])
    assert not process.wait_listening(process.port, timeout_s=10)
    assert process.pid is None
    assert process.exit_code == 3
    assert "bad config" in process.read_log()


def test_a_process_that_ignores_its_stop_signal_is_killed_after_the_timeout(
    tmp_path: Path,
) -> None:
    server = Server(tmp_path / "stubborn.log", ignore_term=True).start()
    pid = server.pid
    assert pid is not None
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started >= server.stop_timeout_s  # SIGTERM was waited for
    assert gone(pid)


def test_children_that_outlive_their_parent_are_killed_too(tmp_path: Path) -> None:
    server = Server(tmp_path / "family.log", child=True).start()
    child = int(server.read_log().split("child ")[1].split()[0])
    assert alive(child)
    server.stop()
    assert gone(child)


def test_a_log_that_does_not_exist_reads_empty(tmp_path: Path) -> None:
    assert Server(tmp_path / "never.log").read_log() == ""
    with pytest.raises(AssertionError, match="spawn"):
        Server(tmp_path / "never.log").wait_listening(1, 0.1)


def test_a_managed_process_without_start_refuses(tmp_path: Path) -> None:
    bare = ManagedProcess()
    with pytest.raises(NotImplementedError):
        bare.start()
    assert bare.pid is None
    assert bare.stop_signal == signal.SIGTERM


def test_a_dumping_process_gets_its_grace_unless_a_signal_stopped_it(tmp_path: Path) -> None:
    """A JVM that dumps its class data sharing archive at exit may take longer than its stop
    timeout to exit (``DUMP_GRACE_S``), but a SIGSTOPped one would never exit: it is killed
    after the stop timeout, and its dump, if any, is discarded, never published. Stand-in:
    a Python server that ignores SIGTERM plays the JVM (no JVM exits on cue)."""
    from resources.jvm import ClassDataSharing

    archive, dump = tmp_path / "Main-x.jsa", tmp_path / "Main-x.dump.tmp"
    server = Server(tmp_path / "server.log", ignore_term=True).start()
    server.sharing = ClassDataSharing(archive, dump, "Main", "a.jar")
    assert server.pid is not None
    dump.write_bytes(b"half")
    os.kill(server.pid, signal.SIGSTOP)
    began = time.monotonic()
    server.stop()
    assert time.monotonic() - began < 5  # not DUMP_GRACE_S
    assert not dump.exists()
    assert not archive.exists()
