"""When check evaluations and failed runs become alerts: the alert noise budget, as pure code.

Per check, only a change of state alerts: ok -> failing is one FAILED, a change of severity while
failing (WARN <-> ERROR) is one FAILED, failing -> ok is one RECOVERED. A check that stays
failing is re-sent as STILL FAILING every ``reminder_s`` seconds (0 = never). Evaluations are
read once, oldest first, so each one counts once whoever ran it (a run, the schedule).

While a *blocking* check of a pipeline fails, its other checks report "not evaluated" with
``blocked_by`` metadata (read under the wrong group id, their figures would be false): such an
evaluation neither alerts nor changes the check's state, so the first real evaluation after the
block clears decides. A run that failed only because a blocking check failed is not a second
alert either: the check's FAILED already says why and how to fix it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

NoticeKind = Literal["check_failed", "check_recovered", "check_still_failing"]
State = dict[str, Any]  # one check's alert state, kept in the sensor's JSON cursor
OK = "ok"


# Digits and hex runs (offsets, partitions, run and commit ids) vary between runs of one cause.
_VOLATILE = re.compile(r"\b[0-9a-f]*[0-9][0-9a-f]*\b")


@dataclass(frozen=True)
class Evaluation:
    """One completed check evaluation, as the alert policy needs it."""

    asset: str  # the asset key as a user string, e.g. "iceberg/demo/orders"
    check: str
    passed: bool
    severity: str  # "ERROR" or "WARN"
    message: str
    timestamp: float
    run_id: str = ""
    blocking: bool = False
    blocked_by: str = ""  # "not evaluated" because this blocking check fails

    @property
    def name(self) -> str:
        """The check's key in the cursor: ``<asset> / <check>``."""
        return f"{self.asset} / {self.check}"

    @property
    def status(self) -> str:
        """``ok``, or the severity it fails with."""
        return OK if self.passed else self.severity


@dataclass(frozen=True)
class Notice:
    """An alert to send about one check."""

    kind: NoticeKind
    asset: str
    check: str
    severity: str
    message: str
    run_id: str
    failing_since: float


def _state(e: Evaluation, since: float, alerted_at: float | None) -> State:
    return {
        "asset": e.asset,
        "check": e.check,
        "blocking": e.blocking,
        "status": e.status,
        "message": e.message,
        "run_id": e.run_id,
        "since": since,
        "alerted_at": alerted_at,
    }


def _notice(kind: NoticeKind, state: State) -> Notice:
    return Notice(
        kind,
        state["asset"],
        state["check"],
        state["status"],
        state["message"],
        state["run_id"],
        state["since"],
    )


def apply_evaluations(
    states: Mapping[str, State], evaluations: Iterable[Evaluation], now: float, reminder_s: float
) -> tuple[dict[str, State], list[Notice]]:
    """The new alert states and the notices to send, for ``evaluations`` oldest first.

    Example:
        >>> fail = Evaluation("t", "c", False, "ERROR", "broken. Fix: x", 10.0)
        >>> states, notices = apply_evaluations({}, [fail, fail], now=20.0, reminder_s=0)
        >>> [n.kind for n in notices], states["t / c"]["status"]
        (['check_failed'], 'ERROR')
        >>> ok = Evaluation("t", "c", True, "ERROR", "fine", 30.0)
        >>> [n.kind for n in apply_evaluations(states, [ok], now=40.0, reminder_s=0)[1]]
        ['check_recovered']
    """
    new = {name: dict(state) for name, state in states.items()}
    notices: list[Notice] = []
    for e in evaluations:
        previous = new.get(e.name)
        if e.blocked_by:
            continue  # not evaluated while the pipeline is blocked: the blocking check alerts
        if e.status == OK:
            if previous is not None and previous["status"] != OK:
                notices.append(
                    Notice(
                        "check_recovered",
                        e.asset,
                        e.check,
                        "INFO",
                        e.message,
                        e.run_id,
                        previous["since"],
                    )
                )
            new[e.name] = _state(e, e.timestamp, None)
        elif previous is None or previous["status"] != e.status:
            failing = previous is not None and previous["status"] != OK
            since = previous["since"] if previous is not None and failing else e.timestamp
            new[e.name] = _state(e, since, now)
            notices.append(_notice("check_failed", new[e.name]))
        else:
            new[e.name] = {**previous, "message": e.message, "run_id": e.run_id}
    if reminder_s > 0:
        for state in new.values():
            if state["status"] != OK and now - (state["alerted_at"] or 0.0) >= reminder_s:
                state["alerted_at"] = now
                notices.append(_notice("check_still_failing", state))
    return new, notices


ReadUpTo = dict[str, float]  # check name -> timestamp of the newest evaluation read


def load_cursor(raw: str | None, now: float) -> tuple[ReadUpTo | None, dict[str, State]]:
    """``(what was read, states)`` from the sensor's cursor; ``None`` read = first tick.

    A cursor of the earlier alert sensor (``{name: {"id", "passed"}}``) keeps its states, as
    already alerted, so an upgrade re-sends nothing.

    Example:
        >>> load_cursor(None, 0.0)
        (None, {})
        >>> read, states = load_cursor('{"t / c": {"id": 3, "passed": false}}', 5.0)
        >>> read, states["t / c"]["status"], states["t / c"]["alerted_at"]
        (None, 'ERROR', 5.0)
    """
    if not raw:
        return None, {}
    data = json.loads(raw)
    if "read" in data and "checks" in data:
        return data["read"], data["checks"]
    legacy: dict[str, State] = {}
    for name, old in data.items():
        asset, _, check = name.partition(" / ")
        status = OK if old.get("passed", True) else "ERROR"
        legacy[name] = {
            "asset": asset,
            "check": check,
            "blocking": False,
            "status": status,
            "message": "",
            "run_id": "",
            "since": now,
            "alerted_at": None if status == OK else now,
        }
    return None, legacy


def dump_cursor(read: ReadUpTo, states: Mapping[str, State]) -> str:
    """The sensor's cursor: what was read of each check, and each check's alert state."""
    return json.dumps({"read": read, "checks": states}, sort_keys=True)


def failed_only_because_blocked(failed_steps: set[str], blocked_steps: set[str]) -> bool:
    """Whether every failed step of a run failed because a blocking check failed in it.

    Example:
        >>> failed_only_because_blocked({"ingest_orders"}, {"ingest_orders"})
        True
        >>> failed_only_because_blocked({"ingest_orders", "ingest_x"}, {"ingest_orders"})
        False
        >>> failed_only_because_blocked(set(), set())
        False
    """
    return bool(failed_steps) and failed_steps <= blocked_steps


def format_duration(seconds: float) -> str:
    """A short human duration.

    Example:
        >>> format_duration(42), format_duration(600), format_duration(9000)
        ('42 s', '10 min', '2.5 h')
    """
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def cause_key(causes: Iterable[str]) -> str:
    """A run failure's causes without what changes from run to run (numbers, ids, offsets):
    two runs failing for one reason have the same key.

    Example:
        >>> a = cause_key(["ingest: offset 17 of orders[2] deleted (run 4f2a9c01)"])
        >>> a == cause_key(["ingest: offset 90 of orders[2] deleted (run 77bb0e13)"])
        True
        >>> a == cause_key(["ingest: table demo.orders was dropped"])
        False
    """
    return " | ".join(sorted(_VOLATILE.sub("#", cause) for cause in causes))
