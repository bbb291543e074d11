"""Peak resident memory of the driver, the Spark JVM and the Python workers during a block."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _children(pid: int) -> list[int]:
    found, frontier = [], [pid]
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, IndexError, ValueError):
                continue
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def _is_jvm(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "java"
    except OSError:
        return False


class PeakRss:
    """Sample RSS every ``interval_s``: this process, its JVM children, their Python workers."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.driver = self.jvm = self.workers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = os.getpid()
        ticks = 0
        children: list[int] = []
        while not self._stop.is_set():
            if ticks % 20 == 0:  # the process tree changes slowly; re-walk it once a second
                children = _children(me)
            ticks += 1
            self.driver = max(self.driver, _rss(me))
            jvm = sum(_rss(p) for p in children if _is_jvm(p))
            workers = sum(_rss(p) for p in children if not _is_jvm(p))
            self.jvm, self.workers = max(self.jvm, jvm), max(self.workers, workers)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
