"""When to launch an ingestion run: the lag sensor's decision, as a pure function.

The sensor (and the freshness benchmark, which must measure the same policy) reads the lag from
offsets and asks :func:`decide`; nothing here reads or writes anything.
"""

from __future__ import annotations

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
