"""Lag in seconds: the age of the oldest uncommitted record, one definition for every reader
(R53).

The lag sensor, the ``commit_freshness`` check and ``platform status`` all call
:func:`measure_lag_age` on the state they read (:class:`ingestion.health.state.PipelineState`), so
they never disagree on how old the waiting records are.

A record's age is ``now`` minus its Kafka timestamp, which a producer sets (CreateTime). A
producer whose clock is ahead stamps records in the future: their age would be zero or less,
and a waiting pipeline would look fresh for as long as the clock is wrong. A timestamp more than
:data:`FUTURE_SKEW_MS` ahead of ``now`` is therefore not trusted; that partition's age is
bounded from the table instead. Its oldest uncommitted record is beyond the offsets of the
pipeline's last commit, so it reached Kafka after that commit planned (the commit's
``kafka.valid-through-ms``, or its commit time if earlier): ``now`` minus that time is at least
the record's real age (it over-reports, never under-reports). Without any commit the bound is
the time the caller first saw the record (the lag sensor remembers it), else unknown (None),
which the checks report as failing, never as fresh.

Where the bound is weaker: after a commit capped by ``max_records_per_run`` whose own records
carry future timestamps, or after an operator's backward reset (no plan time recorded), the
bound is that commit's time; a record waiting from before it is then older than reported. The
bound still grows while nothing commits, so records cannot look fresh for ever.

Nothing here reads or writes: retrying it is free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ingestion.kafka.ranges import Key
from ingestion.table.offsets import VALID_THROUGH_MS

if TYPE_CHECKING:
    from ingestion.health.state import PipelineState

FUTURE_SKEW_MS = 5_000
"""How far ahead of ``now`` a record timestamp may be and still be trusted (clock skew)."""


@dataclass(frozen=True)
class FutureStamp:
    """A partition whose oldest uncommitted record carries a timestamp in the future."""

    key: Key
    offset: int
    timestamp_ms: int
    ahead_s: float

    def describe(self) -> str:
        """Where the timestamp is, for check messages and logs.

        Example:
            >>> FutureStamp(("orders", 2), 17, 9_000_000, 3600.0).describe()
            'orders[2] offset 17 (timestamp 3600 s in the future)'
        """
        topic, partition = self.key
        return (
            f"{topic}[{partition}] offset {self.offset} "
            f"(timestamp {self.ahead_s:.0f} s in the future)"
        )


@dataclass(frozen=True)
class LagAge:
    """The age of the oldest uncommitted record, overall and per lagging partition.

    ``seconds`` is the largest partition age (None when no lagging partition's age is known);
    ``unknown`` lists partitions whose age cannot be bounded (a future timestamp and no commit
    nor first sighting); ``future`` the partitions whose timestamp was not trusted.
    """

    seconds: float | None
    partitions: dict[Key, float] = field(default_factory=dict)
    future: tuple[FutureStamp, ...] = ()
    unknown: tuple[Key, ...] = ()

    def describe_future(self) -> str:
        """The untrusted timestamps in one line ('' when none)."""
        return "; ".join(f.describe() for f in self.future[:5])


def commit_bound_ms(state: PipelineState) -> int | None:
    """When the pipeline's last commit planned (at most its commit time): every record beyond
    its offsets reached Kafka after it. None without any commit.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> commit_bound_ms(NS(commits=[NS(timestamp_ms=9_000,
        ...     properties={"kafka.valid-through-ms": "8000"})]))
        8000
        >>> commit_bound_ms(NS(commits=[NS(timestamp_ms=9_000, properties={})]))
        9000
        >>> commit_bound_ms(NS(commits=[])) is None
        True
    """
    if not state.commits:
        return None
    last = state.commits[0]
    text = last.properties.get(VALID_THROUGH_MS) or ""
    through = int(text) if text.isdigit() else last.timestamp_ms
    return min(through, last.timestamp_ms)


def measure_lag_age(
    state: PipelineState, now_ms: int, first_seen_ms: Mapping[Key, int] | None = None
) -> LagAge:
    """Lag in seconds of ``state`` at ``now_ms`` (pure; see the module docstring).

    ``first_seen_ms`` (partition -> when the caller first saw its current oldest uncommitted
    record) bounds a future-stamped partition when the pipeline never committed.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> s = NS(commits=[NS(timestamp_ms=900_000, properties={})],
        ...     oldest_uncommitted_ms={("t", 0): 995_000, ("t", 1): 5_000_000},
        ...     uncommitted_ranges=lambda: {("t", 0): (3, 9), ("t", 1): (40, 41)})
        >>> age = measure_lag_age(s, now_ms=1_000_000)
        >>> age.seconds, age.partitions, age.describe_future()
        (100.0, {('t', 0): 5.0, ('t', 1): 100.0}, 't[1] offset 40 (timestamp 4000 s in the future)')
    """
    oldest = state.oldest_uncommitted_ms
    if not oldest:
        return LagAge(None)
    starts = {k: r[0] for k, r in state.uncommitted_ranges().items()}
    bound = commit_bound_ms(state)
    ages: dict[Key, float] = {}
    future: list[FutureStamp] = []
    unknown: list[Key] = []
    for key, stamp in sorted(oldest.items()):
        if stamp <= now_ms + FUTURE_SKEW_MS:
            ages[key] = max(0.0, (now_ms - stamp) / 1000)
            continue
        future.append(FutureStamp(key, starts.get(key, -1), stamp, (stamp - now_ms) / 1000))
        since = bound if bound is not None else (first_seen_ms or {}).get(key)
        if since is None:
            unknown.append(key)
        else:
            ages[key] = max(0.0, (now_ms - since) / 1000)
    seconds = max(ages.values()) if ages else None
    return LagAge(seconds, ages, tuple(future), tuple(unknown))


def measure_with_sightings(
    state: PipelineState, now_ms: int, seen: Mapping[str, int]
) -> tuple[LagAge, dict[str, int]]:
    """:func:`measure_lag_age` for a caller that remembers, across evaluations, when it first
    saw each future-stamped oldest record (``seen``: ``topic[p]@offset`` -> ms; the lag sensor
    keeps it in its cursor). Before the pipeline's first commit that sighting is the only bound
    on such a record's age (it grows from the first sighting; never zero for ever).

    Returns the age and the sightings to keep (the records still oldest and future-stamped).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> s = NS(commits=[], oldest_uncommitted_ms={("t", 0): 5_000_000},
        ...     uncommitted_ranges=lambda: {("t", 0): (0, 9)})
        >>> age, seen = measure_with_sightings(s, 1_000_000, {})
        >>> age.seconds, seen
        (0.0, {'t[0]@0': 1000000})
        >>> measure_with_sightings(s, 1_090_000, seen)[0].seconds
        90.0
    """
    names = {k: f"{k[0]}[{k[1]}]@{r[0]}" for k, r in state.uncommitted_ranges().items()}
    first_seen = {k: seen.get(name, now_ms) for k, name in names.items()}
    waited = measure_lag_age(state, now_ms, first_seen)
    keep = {names[f.key]: first_seen[f.key] for f in waited.future if f.key in names}
    return waited, keep
