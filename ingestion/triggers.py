"""When to launch a run: the lag sensor's decisions, as pure functions.

The sensor (and the freshness benchmark, which must measure the same policy) reads the lag from
offsets and asks :func:`decide`; while the blocking group check fails it asks
:func:`decide_group_check` instead (at most one run per cause). Nothing here reads or writes.
"""

from __future__ import annotations

from ingestion.checks import GROUP_CHECK, Finding
from ingestion.spec import PipelineSpec


def decide(
    lag: int, first_lag_at: float | None, now: float, spec: PipelineSpec, busy: bool
) -> tuple[bool, str, float | None]:
    """Whether to request a run, why, and the new time lag was first seen (pure).

    Example:
        >>> from ingestion.spec import parse_pipeline_spec
        >>> spec = parse_pipeline_spec({"name": "p", "topic": "t", "table": "n.t",
        ...     "consumer_group_id": "g", "value_format": "raw", "max_lag_records": 100,
        ...     "max_lag_seconds": 60})
        >>> decide(0, None, 1000.0, spec, busy=False)[:2]
        (False, 'idle: no uncommitted records')
        >>> decide(150, None, 1000.0, spec, busy=False)[:2]
        (True, 'lag 150 >= 100 records')
        >>> decide(5, 900.0, 1000.0, spec, busy=False)[:2]
        (True, 'oldest uncommitted lag is 100 s old >= 60 s')
    """
    if lag == 0:
        return False, "idle: no uncommitted records", None
    first = first_lag_at if first_lag_at is not None else now
    age = now - first
    if busy:
        return False, f"lag {lag}: a run of {spec.name!r} is already queued or running", first
    if lag >= spec.max_lag_records:
        return True, f"lag {lag} >= {spec.max_lag_records} records", first
    if age >= spec.max_lag_seconds:
        return True, f"oldest uncommitted lag is {age:.0f} s old >= {spec.max_lag_seconds} s", first
    return (
        False,
        (f"lag {lag} < {spec.max_lag_records} records and {age:.0f} s < {spec.max_lag_seconds} s"),
        first,
    )


def decide_group_check(
    now: Finding, latest: Finding | None, requested: str | None, busy: bool
) -> tuple[bool, str]:
    """Whether to request a run that evaluates the blocking group check, and why (pure).

    ``now`` is what the sensor just evaluated, ``latest`` the check's newest completed
    evaluation in Dagster, ``requested`` the fingerprint of the outcome a run was last requested
    for. A run is due when the sensor's outcome or the recorded one blocks and they differ: the
    Checks tab and the alert sensor then learn of a block, or of its fix, within one run. At
    most one run per cause; none while a run of the pipeline is queued or running (it
    evaluates the check itself).

    Example:
        >>> from ingestion.checks import failed, passed
        >>> bad, good = failed("ERROR", "renamed group"), passed("ok")
        >>> decide_group_check(bad, good, None, busy=False)
        (True, 'group_id_consistency changed: evaluate it in a run')
        >>> decide_group_check(bad, bad, None, busy=False)[0]  # already recorded
        False
        >>> decide_group_check(good, good, None, busy=False)[0]  # nothing blocks
        False
    """
    if not now.blocks and (latest is None or not latest.blocks):
        return False, f"{GROUP_CHECK.name} passes or only warns"
    if latest is not None and latest.fingerprint == now.fingerprint:
        return False, f"{GROUP_CHECK.name}'s newest evaluation already says this"
    if busy:
        return False, f"a run is queued or running; it evaluates {GROUP_CHECK.name}"
    if requested == now.fingerprint:
        return False, f"a run evaluating {GROUP_CHECK.name} was already requested for this cause"
    return True, f"{GROUP_CHECK.name} changed: evaluate it in a run"
