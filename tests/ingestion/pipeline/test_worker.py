"""The shared stream worker's lanes (``ingestion.pipeline.worker``), on lanes that only wait:
what is reconciled, restarted and isolated. The lanes' streaming itself is the engine's
``stream_pipeline``, tested on the real stack in tests/platform_assets/streaming."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ingestion.pipeline.stream import StreamSummary
from ingestion.pipeline.worker import StreamWorker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Lanes:
    """Lanes that run until asked to stop, or fail at once for the pipelines in ``failing``."""

    def __init__(self, failing: set[str] | None = None) -> None:
        self.failing = failing or set()
        self.started: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, name: str, version: str, stop: threading.Event) -> StreamSummary:
        with self.lock:
            self.started.append((name, version))
        if name in self.failing:
            raise RuntimeError(f"topic of {name} not found")
        stop.wait()
        return StreamSummary(stopped_because="asked")


def test_lanes_follow_the_assignment_one_pipeline_at_a_time() -> None:
    lanes, clock = Lanes(), Clock()
    worker = StreamWorker(lanes, lambda outcome: 30.0, clock)
    wanted = {"a": "v1", "b": "v1"}
    worker.start(worker.due(wanted), wanted)
    wait_until(lambda: worker.serving() == wanted)
    # c added, a changed, b removed: only those lanes move.
    wanted = {"a": "v2", "c": "v1"}
    assert sorted(worker.stop_unwanted(wanted)) == ["a", "b"]
    assert worker.due(wanted) == ["c"]  # a waits for its old lane to end: never two lanes
    worker.start(["c"], wanted)
    wait_until(lambda: worker.serving() == {"c": "v1"})  # a's and b's lanes ended
    outcomes = worker.reap()
    assert sorted((o.pipeline, o.asked, o.failed) for o in outcomes) == [
        ("a", True, False),
        ("b", True, False),
    ]
    assert worker.due(wanted) == ["a"]  # asked to stop: restarts at once at the new version
    worker.start(["a"], wanted)
    wait_until(lambda: worker.serving() == wanted)
    assert lanes.started == [("a", "v1"), ("b", "v1"), ("c", "v1"), ("a", "v2")]
    assert {o.pipeline for o in worker.stop_all(5)} == {"a", "c"}
    assert worker.serving() == {}


def test_a_failing_lane_is_isolated_and_restarted_after_the_backoff() -> None:
    lanes, clock = Lanes(failing={"bad"}), Clock()
    worker = StreamWorker(lanes, lambda outcome: 30.0, clock)
    wanted = {"bad": "v1", "good": "v1"}
    worker.start(worker.due(wanted), wanted)
    wait_until(lambda: worker.serving() == {"good": "v1"})
    (outcome,) = worker.reap()
    assert (outcome.pipeline, outcome.failed) == ("bad", True)
    assert "topic of bad not found" in outcome.error
    assert worker.due(wanted) == []  # within the backoff
    clock.now += 31
    assert worker.due(wanted) == ["bad"]
    assert worker.serving() == {"good": "v1"}  # the healthy lane never stopped
    assert lanes.started.count(("good", "v1")) == 1
    worker.stop_all(5)


def test_a_lane_that_stopped_by_itself_waits_as_its_outcome_says() -> None:
    stops = {"moved": "failed over from 'primary' to 'dr'", "blocked": "blocked by a check"}

    def lane(name: str, version: str, stop: threading.Event) -> StreamSummary:
        return StreamSummary(stopped_because=stops[name])

    clock = Clock()
    worker = StreamWorker(lane, lambda o: 0.0 if o.reason.startswith("failed over") else 30, clock)
    wanted = {"moved": "v1", "blocked": "v1"}
    worker.start(worker.due(wanted), wanted)
    wait_until(lambda: worker.serving() == {})
    assert {o.pipeline for o in worker.reap()} == {"moved", "blocked"}
    assert worker.due(wanted) == ["moved"]
