"""Shared stream workers: one long-lived process streams many pipelines, each on its own lane.

A *lane* is one pipeline's :func:`ingestion.pipeline.stream.stream_pipeline` loop on a thread
of the worker. The worker is told which pipelines it serves (``wanted``: pipeline name -> the
version of its spec) and reconciles its lanes to it: it starts a lane for a wanted pipeline
that has none, asks a lane whose pipeline is no longer wanted, or wanted at another version, to
stop between two commits (then, once it has, starts the new version), and restarts a lane that
ended by itself once ``restart_after`` allows. A pipeline never has two lanes at once. Lanes
share nothing but the process and the Spark session: each plans, commits and compares-and-sets
its own pipeline, so one pipeline's failure (a missing topic, a bad spec, a blocked check, a
hot partition's long catch-up) ends or slows its own lane only.

Delivery: exactly once, as a stream's, because a lane *is* a stream: each iteration is one
``run_pipeline`` (one compare-and-set commit carrying the offsets). Stopping a lane waits for
its iteration to end; a lane that fails committed nothing past its last report, and its
successor re-plans from the table's offsets. Another writer of the same pipeline (a run, an
operator action, a second worker during a handover) races on the compare-and-set: one commit
wins, the other re-plans (rule 1). Nothing here reads Kafka or writes a table by itself.

The orchestrator (``platform_assets/streaming/jobs.py``) decides what is wanted and reports
what the lanes do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ingestion.pipeline.stream import StreamSummary


@dataclass(frozen=True)
class LaneOutcome:
    """How a lane ended: asked to stop, stopped by itself (``reason``), or failed (``error``)."""

    pipeline: str
    version: str
    ended_at: float
    asked: bool
    reason: str = ""
    error: str = ""
    summary: StreamSummary | None = None

    @property
    def failed(self) -> bool:
        """Whether the lane ended with an error (not between commits by a ``should_stop``)."""
        return bool(self.error)


RunLane = Callable[[str, str, threading.Event], StreamSummary]
"""Stream one pipeline until its ``should_stop`` says so: (pipeline, version, the lane's stop
event, set when the worker asks it to stop) -> the stream's summary. Raising fails the lane."""


@dataclass
class Lane:
    """One pipeline's stream on a thread of the worker."""

    pipeline: str
    version: str
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    outcome: LaneOutcome | None = None  # set by the thread as it ends

    @property
    def alive(self) -> bool:
        """Whether the lane's thread still runs (a lane asked to stop runs until it does)."""
        return self.thread is not None and self.thread.is_alive()


class StreamWorker:
    """Lanes of many pipelines in one process (see the module docstring).

    ``restart_after(outcome)`` is how many seconds after ``outcome`` a lane that ended by
    itself may start again (a lane asked to stop restarts at once when still wanted);
    ``clock`` is wall-clock seconds.
    """

    def __init__(
        self,
        run_lane: RunLane,
        restart_after: Callable[[LaneOutcome], float],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._run_lane = run_lane
        self._restart_after = restart_after
        self._clock = clock
        self._lanes: dict[str, Lane] = {}
        self.outcomes: dict[str, LaneOutcome] = {}

    def serving(self) -> dict[str, str]:
        """The pipelines with a live lane (one asked to stop too, until it has): name -> version."""
        return {lane.pipeline: lane.version for lane in self._lanes.values() if lane.alive}

    def reap(self) -> list[LaneOutcome]:
        """Collect the lanes that ended since the last call; return their outcomes."""
        ended = []
        for name, lane in list(self._lanes.items()):
            if lane.thread is not None and not lane.alive:
                del self._lanes[name]
                if lane.outcome is not None:
                    self.outcomes[name] = lane.outcome
                    ended.append(lane.outcome)
        return ended

    def stop_unwanted(self, wanted: Mapping[str, str], why: str = "") -> list[str]:
        """Ask the lanes whose pipeline is not in ``wanted``, or wanted at another version, to
        stop between two commits; return their pipelines. A new version starts once the old
        lane has ended (:meth:`reap`, then :meth:`due`)."""
        asked = []
        for name, lane in self._lanes.items():
            if wanted.get(name) != lane.version and not lane.stop.is_set():
                lane.stop.set()
                asked.append(name)
        return asked

    def due(self, wanted: Mapping[str, str]) -> list[str]:
        """The wanted pipelines without a lane that may start now."""
        now, names = self._clock(), []
        for name in sorted(wanted):
            if name in self._lanes:
                continue
            outcome = self.outcomes.get(name)
            if outcome is not None and not outcome.asked and self._waiting(outcome, now):
                continue
            names.append(name)
        return names

    def _waiting(self, outcome: LaneOutcome, now: float) -> bool:
        return now - outcome.ended_at < self._restart_after(outcome)

    def start(self, names: Iterable[str], wanted: Mapping[str, str]) -> None:
        """Start a lane for each of ``names`` at its wanted version."""
        for name in names:
            lane = Lane(name, wanted[name])
            lane.thread = threading.Thread(
                target=self._body, args=(lane,), name=f"lane-{name}", daemon=True
            )
            self._lanes[name] = lane
            lane.thread.start()

    def stop_all(self, timeout_s: float | None = None) -> list[LaneOutcome]:
        """Ask every lane to stop and wait for them (each ends between two commits)."""
        lanes = list(self._lanes.values())
        for lane in lanes:
            lane.stop.set()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for lane in lanes:
            if lane.thread is not None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                lane.thread.join(left)
        return self.reap()

    def _body(self, lane: Lane) -> None:
        error, summary = "the lane ended without a summary", None
        try:
            summary = self._run_lane(lane.pipeline, lane.version, lane.stop)
            error = ""
        except BaseException as exc:  # a lane's failure is its own (isolation)
            error = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, Exception):
                raise  # SystemExit, KeyboardInterrupt: the outcome below still records it
        finally:
            lane.outcome = LaneOutcome(
                lane.pipeline,
                lane.version,
                self._clock(),
                asked=lane.stop.is_set(),
                reason=summary.stopped_because if summary is not None else "",
                error=error,
                summary=summary,
            )
