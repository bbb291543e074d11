"""Offset ranges: the unit of work of one task, and the arithmetic that caps and splits them.

Pure functions over ``(topic, partition) -> offset`` maps; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Key = tuple[str, int]  # (topic, partition): the key of every offset map
Coordinates = tuple[str, int, int]  # (topic, partition, offset): one record, as rows record it


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition; the unit of work of one Spark task."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """Offsets covered (records may be fewer: markers, compaction)."""
        return self.end - self.start


@dataclass(frozen=True)
class LostRange:
    """Offsets deleted by retention before they were read (recorded when ``on_data_loss=skip``)."""

    topic: str
    partition: int
    start: int
    end: int


def cap_ends(start: Mapping[Key, int], end: Mapping[Key, int], cap: int | None) -> dict[Key, int]:
    """Lower end offsets so that at most ``cap`` offsets are planned, shared fairly (R21).

    Example:
        >>> cap_ends({("t", 0): 0, ("t", 1): 0}, {("t", 0): 10, ("t", 1): 3}, 8)
        {('t', 0): 5, ('t', 1): 3}
    """
    if cap is None or sum(end[k] - start[k] for k in end) <= cap:
        return dict(end)
    capped = dict(start)
    budget = cap
    pending = sorted(end, key=lambda k: end[k] - start[k])  # smallest first: water-filling
    for index, key in enumerate(pending):
        share = -(-budget // (len(pending) - index))  # ceiling of a fair share of what is left
        take = min(end[key] - start[key], share, budget)
        capped[key] = start[key] + take
        budget -= take
    return capped


def split_tasks(start: Mapping[Key, int], end: Mapping[Key, int], size: int) -> list[OffsetRange]:
    """Split each partition's range into tasks of at most ``size`` offsets.

    Example:
        >>> [(r.start, r.end) for r in split_tasks({("t", 0): 0}, {("t", 0): 5}, 2)]
        [(0, 2), (2, 4), (4, 5)]
    """
    tasks = []
    for key in sorted(end):
        topic, partition = key
        for offset in range(start[key], end[key], size):
            tasks.append(OffsetRange(topic, partition, offset, min(offset + size, end[key])))
    return tasks
