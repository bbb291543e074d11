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
        """Stop the process group; a no-op when it is not running. A JVM that dumps its class
        data sharing archive at exit is given :data:`~resources.jvm.DUMP_GRACE_S` to stop
        cleanly (once per archive), and the archive is published."""
        process, self._process = self._process, None
        sharing, self.sharing = self.sharing, None
        if process is None:
            return
        timeout = self.stop_timeout_s
        if sharing is not None and sharing.dump is not None:
            timeout = max(timeout, DUMP_GRACE_S)
        killed = False
        if process.poll() is None:
            for sig in (self.stop_signal, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
                killed = sig == signal.SIGKILL
                try:
                    process.wait(timeout)
                    break
                except subprocess.TimeoutExpired:
                    continue
            with contextlib.suppress(ProcessLookupError):  # children that outlived it, if any
                os.killpg(process.pid, signal.SIGKILL)
        if sharing is not None:
            sharing.publish(complete=not killed)  # a JVM killed while dumping left half a file

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
