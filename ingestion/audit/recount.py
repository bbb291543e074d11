"""Which offset ranges a commit covers, for the audit's independent recount (pure, R46).

A commit's snapshot records its next offsets; its ranges start at the previous commit's
offsets, at ``kafka.range-starts`` for partitions absent from those (new partitions or topics,
a group's first commit), and after a range recorded in ``kafka.lost-ranges``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ingestion.kafka.ranges import Key, OffsetRange
from ingestion.table.offsets import LOST_RANGES, RANGE_STARTS, decode_starts

_LOST = re.compile(r"^(?P<topic>.+)\[(?P<partition>\d+)\] \[(?P<start>\d+), (?P<end>\d+)\)$")


@dataclass(frozen=True)
class Recount:
    """The ranges to recount for one commit. ``exact`` is False where a start is a lower bound
    (then only a commit adding fewer records than Kafka holds is flagged); ``verifiable`` is
    False when a first commit's start is not recorded (nothing can be compared)."""

    ranges: tuple[OffsetRange, ...]
    exact: bool = True
    verifiable: bool = True


def parse_lost_ranges(text: str) -> dict[Key, int]:
    """(topic, partition) -> end of the range recorded as lost (``kafka.lost-ranges``).

    Example:
        >>> parse_lost_ranges("orders[0] [10, 20);orders[3] [0, 5)")
        {('orders', 0): 20, ('orders', 3): 5}
    """
    return {key: end for key, (_, end) in parse_lost_spans(text).items()}


def parse_lost_spans(text: str) -> dict[Key, tuple[int, int]]:
    """(topic, partition) -> the ``[start, end)`` recorded as lost (``kafka.lost-ranges``);
    malformed items are ignored.

    Example:
        >>> parse_lost_spans("orders[0] [10, 20);orders[3] [0, 5); junk")
        {('orders', 0): (10, 20), ('orders', 3): (0, 5)}
    """
    lost = {}
    for item in filter(None, text.split(";")):
        match = _LOST.match(item.strip())
        if match:
            lost[(match["topic"], int(match["partition"]))] = (
                int(match["start"]),
                int(match["end"]),
            )
    return lost


def plan_recount(
    previous: dict[Key, int] | None,
    current: dict[Key, int],
    properties: dict[str, str],
    log_starts: dict[Key, int],
) -> Recount:
    """The ranges of one commit (``previous`` is None for the group's first commit) (pure).

    A partition absent from ``previous`` starts where ``kafka.range-starts`` says; if that is
    not recorded it started at its log start when planned (R18), at most today's log start, so
    today's log start gives a lower bound. A first commit without recorded starts may have
    started anywhere (``latest``, a timestamp): not verifiable.

    Example:
        >>> plan_recount({("t", 0): 10}, {("t", 0): 30, ("t", 1): 4},
        ...              {"kafka.range-starts": '{"t":{"1":0}}'}, {})
        Recount(ranges=(OffsetRange(topic='t', partition=0, start=10, end=30), \
OffsetRange(topic='t', partition=1, start=0, end=4)), exact=True, verifiable=True)
        >>> plan_recount({("t", 0): 10}, {("t", 0): 10, ("t", 1): 4}, {}, {("t", 1): 1})
        Recount(ranges=(OffsetRange(topic='t', partition=1, start=1, end=4),), exact=False, \
verifiable=True)
        >>> plan_recount(None, {("t", 0): 30}, {}, {}).verifiable
        False
    """
    starts = decode_starts(properties[RANGE_STARTS]) if RANGE_STARTS in properties else {}
    lost = parse_lost_ranges(properties.get(LOST_RANGES, ""))
    ranges, exact = [], True
    for key, end in sorted(current.items()):
        start = (previous or {}).get(key, starts.get(key))
        if start is None and previous is None:
            return Recount((), exact=False, verifiable=False)
        if key in lost and start is not None:
            start = max(start, lost[key])
        floor = log_starts.get(key, 0)
        if start is None or start < floor:  # not recorded, or no longer in Kafka (retention)
            start, exact = floor, False
        if end > start:
            ranges.append(OffsetRange(key[0], key[1], start, end))
    return Recount(tuple(ranges), exact)
