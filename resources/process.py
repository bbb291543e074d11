"""A server process the platform starts for itself: the embedded broker, the Spark Connect
server of ``make dev``, the tests' PostgreSQL.

Each runs in its own process group, writes to one log file, and is always stopped on exit
(its stop signal to the whole group, SIGKILL after ``stop_timeout_s``, then SIGKILL again for
children that outlived their parent), so none outlives its owner.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from resources.jvm import DUMP_GRACE_S, ClassDataSharing


class ManagedProcess:
    """The start/stop/log plumbing of a server process; subclasses define :meth:`start`."""

    log_path: Path
    stop_timeout_s: float = 5.0
    stop_signal: signal.Signals = signal.SIGTERM
    _process: subprocess.Popen[bytes] | None = None
    # A JVM server's class data sharing archive (resources.jvm.ClassDataSharing): set by
    # :meth:`class_sharing_options`, published once the process is gone.
    sharing: ClassDataSharing | None = None

    @property
    def pid(self) -> int | None:
        """The process id while it runs."""
        return self._process.pid if self._process else None

    def start(self) -> Self:
        """Start the process and wait until it serves."""
        raise NotImplementedError

    def spawn(self, command: list[str], **popen: Any) -> subprocess.Popen[bytes]:
        """Start ``command`` in a new process group, its output appended to ``log_path``."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **popen
            )
        return self._process

    def wait_listening(
        self,
        port: int,
        timeout_s: float,
        interval_s: float = 0.05,
        ready: Callable[[], bool] | None = None,
    ) -> bool:
        """Wait until ``127.0.0.1:port`` accepts connections (and ``ready()`` holds).

        Returns False when the process exited first (it is then forgotten: :attr:`pid` is
        None, its exit code in :attr:`exit_code`) or the timeout passed (it is still running:
        the caller stops it or raises).
        """
        assert self._process is not None, "spawn() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self.exit_code: int | None = self._process.returncode
                self._process = None
                return False
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                if ready is None or ready():
                    return True
            time.sleep(interval_s)
        return False

    def class_sharing_options(self, main: str, cp: str) -> list[str]:
        """The ``java`` options that share ``main``'s classes on ``cp`` across starts (a JVM
        server's next start maps them: faster), remembered for :meth:`stop`."""
        self.sharing = ClassDataSharing.for_server(main, cp)
        return self.sharing.options

    def stop(self) -> None:
        """Stop the process group; a no-op when it is not running (a dump a JVM left when it
        exited on its own is discarded). A JVM that dumps its class data sharing archive at
        exit gets its stop timeout, then up to :data:`~resources.jvm.DUMP_GRACE_S` while it is
        not stopped by a signal, to exit cleanly; its archive is published if it exited cleanly
        (0, or 143 after SIGTERM). Interrupted (a second Ctrl-C), it is killed, never left."""
        process, self._process = self._process, None
        sharing, self.sharing = self.sharing, None
        if process is None:
            if sharing is not None:
                sharing.publish(complete=False)
            return
        dumping = sharing is not None and sharing.dump is not None
        try:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, self.stop_signal)
                if not _exited(process, self.stop_timeout_s):
                    graced = dumping and not _stopped_by_signal(process.pid)
                    if not (graced and _exited(process, DUMP_GRACE_S - self.stop_timeout_s)):
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(process.pid, signal.SIGKILL)
                        _exited(process, self.stop_timeout_s)
        finally:
            with contextlib.suppress(ProcessLookupError):  # children that outlived it, if any
                os.killpg(process.pid, signal.SIGKILL)
        if sharing is not None:
            sharing.publish(complete=process.poll() in (0, 143))

    def read_log(self, max_chars: int = 20_000) -> str:
        """The tail of the process's log."""
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-max_chars:]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _exited(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Whether ``process`` exited within ``timeout_s``."""
    try:
        process.wait(max(0.0, timeout_s))
    except subprocess.TimeoutExpired:
        return False
    return True


def _stopped_by_signal(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP: it would never exit on its own), per ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] in ("T", "t")
