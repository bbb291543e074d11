"""When to launch a run: the lag sensor's decisions, as pure functions.

The sensor (and the freshness benchmark, which must measure the same policy) reads the lag from
offsets and asks :func:`decide`; while the blocking group check fails it asks
:func:`decide_group_check` instead (at most one run per cause). Nothing here reads or writes.
"""

from __future__ import annotations

from ingestion.health.checks import GROUP_CHECK, Finding
from ingestion.spec.pipeline import PipelineSpec

# Produce -> queryable floor of run-per-commit on ``make dev``, measured (docs/freshness.md,
# ``scripts/freshness.py --rate 20 --minutes 4 --target 60``): with the earliest trigger (the
# oldest record 1 s old), p95 18.9 s, max 22.2 s: the lag sensor's 15 s tick plus a ~4 s run
# (launch, small batch in process, Spark Connect above, checks outside the run). Was 60 s
# (p95 43 s) while every run started its own Spark. A target below this floor cannot be met by
# launching runs: such a pipeline streams (one long-lived run).
RUN_PER_COMMIT_FLOOR_SECONDS = 30
SENSOR_INTERVAL_SECONDS = 15
# A stream commits a few times per target: p95 is about one interval plus one commit (~1 s).
MIN_COMMIT_INTERVAL_SECONDS = 1.0
MAX_COMMIT_INTERVAL_SECONDS = 15.0


def is_continuous(spec: PipelineSpec) -> bool:
    """Whether the pipeline streams: its freshness target is below the run-per-commit floor.

    Example:
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> base = {"name": "p", "topic": "t", "table": "n.t", "consumer_group_id": "g",
        ...     "value_format": "raw"}
        >>> is_continuous(parse_pipeline_spec({**base, "freshness_target_seconds": 15}))
        True
        >>> is_continuous(parse_pipeline_spec({**base, "freshness_target_seconds": 600}))
        False
        >>> is_continuous(parse_pipeline_spec(base))
        False
    """
    target = spec.freshness_target_seconds
    return target is not None and target < RUN_PER_COMMIT_FLOOR_SECONDS


def commit_interval_seconds(spec: PipelineSpec) -> float:
    """Seconds between a stream's commits: a quarter of the target, within [1, 15].

    Example:
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> commit_interval_seconds(parse_pipeline_spec({"name": "p", "topic": "t",
        ...     "table": "n.t", "consumer_group_id": "g", "value_format": "raw",
        ...     "freshness_target_seconds": 15}))
        3.75
    """
    target = spec.freshness_target_seconds or RUN_PER_COMMIT_FLOOR_SECONDS
    return min(MAX_COMMIT_INTERVAL_SECONDS, max(MIN_COMMIT_INTERVAL_SECONDS, target / 4))


def max_lag_age_seconds(spec: PipelineSpec) -> int:
    """Age of the oldest uncommitted record at which the lag sensor launches a run.

    With a freshness target (run-per-commit), the target minus the floor: a run launched then
    commits within the target. Without one, ``max_lag_seconds``.

    Example:
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> max_lag_age_seconds(parse_pipeline_spec({"name": "p", "topic": "t",
        ...     "table": "n.t", "consumer_group_id": "g", "value_format": "raw",
        ...     "freshness_target_seconds": 300}))
        270
    """
    target = spec.freshness_target_seconds
    if target is None:
        return spec.max_lag_seconds
    return max(1, target - RUN_PER_COMMIT_FLOOR_SECONDS)


def decide(lag: int, age_s: float | None, spec: PipelineSpec, busy: bool) -> tuple[bool, str]:
    """Whether to request a run, and why (pure).

    ``lag`` counts uncommitted offsets; ``age_s`` is the age of the oldest uncommitted record
    (:func:`ingestion.health.lag.measure_lag_age`; None when it could not be read, then only
    ``lag`` counts).

    Example:
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> spec = parse_pipeline_spec({"name": "p", "topic": "t", "table": "n.t",
        ...     "consumer_group_id": "g", "value_format": "raw", "max_lag_records": 100,
        ...     "max_lag_seconds": 60})
        >>> decide(0, None, spec, busy=False)
        (False, 'idle: no uncommitted records')
        >>> decide(150, 1.0, spec, busy=False)
        (True, 'lag 150 >= 100 records')
        >>> decide(5, 100.0, spec, busy=False)
        (True, 'oldest uncommitted record is 100 s old >= 60 s')
    """
    if lag == 0:
        return False, "idle: no uncommitted records"
    age = age_s or 0.0
    limit = max_lag_age_seconds(spec)
    if busy:
        return False, f"lag {lag}: a run of {spec.name!r} is already queued or running"
    if lag >= spec.max_lag_records:
        return True, f"lag {lag} >= {spec.max_lag_records} records"
    if age >= limit:
        return True, f"oldest uncommitted record is {age:.0f} s old >= {limit} s"
    return False, f"lag {lag} < {spec.max_lag_records} records and {age:.0f} s < {limit} s"


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
        >>> from ingestion.health.checks import failed, passed
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
