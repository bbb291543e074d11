"""Which worker runs what under pytest-xdist (``make test``: ``-n 2 --dist loadscope
--no-loadscope-reorder``).

Every test belongs to a group (:func:`group_of`): its module's, or ``dev_stack`` for the modules
sharing the one `make dev` stack (``tests.support.dev_stack.DEV_STACK_ORDER``). A group runs on
one worker, in the order collected, so that a module's fixtures (a cluster pair, a Spark cluster,
a bench run) and the stack start once (:class:`GroupScheduling`). The groups are handed out
longest first (:func:`order_groups`; ``--no-loadscope-reorder`` keeps that order): a long group
started last would run on alone while the other worker idles. How long a group takes comes from
``tests/durations.json``, written from a full run's ``--durations=0`` listing by
``python -m tests.support.suite_order LOG``; a group not in it (a new module) counts as
:data:`UNKNOWN_S`. A stale file only makes the schedule worse, never a test wrong.

xdist's own ``--dist loadgroup`` (an ``xdist_group`` mark) groups nothing with pytest 9.2: it
renames the test's ``_nodeid``, which pytest 9.2 no longer reads. ``loadscope`` groups by the
scope its scheduler's ``_split_scope`` returns; :class:`GroupScheduling` overrides that one
method (a protected method of xdist's public scheduler class, through xdist's public
``pytest_xdist_make_scheduler`` hook, in this module only).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.support.dev_stack import DEV_STACK_ORDER

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
UNKNOWN_S = 30.0
"""The seconds assumed for a group missing from the durations file."""


def group_of(nodeid: str) -> str:
    """A test's group: ``dev_stack`` for a module of the shared stack, else its module's path."""
    module = nodeid.split("::")[0]
    return "dev_stack" if Path(module).name in DEV_STACK_ORDER else module


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with :func:`group_of` as the scope."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


def make_scheduler(config: pytest.Config, log: Any) -> GroupScheduling | None:
    """The scheduler for ``--dist loadscope``; None (xdist's own) for any other mode."""
    return GroupScheduling(config, log) if config.getoption("dist") == "loadscope" else None


def order_groups(items: list[pytest.Item]) -> None:
    """Order the groups longest first, each group's items in the order they had (every worker
    collects, and orders, the same way)."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    groups = [group_of(item.nodeid) for item in items]
    position = {group: n for n, group in reversed(list(enumerate(groups)))}
    ranked = sorted(
        range(len(items)),
        key=lambda n: (-known.get(groups[n], UNKNOWN_S), position[groups[n]], n),
    )
    items[:] = [items[n] for n in ranked]


def durations_by_group(log: str) -> dict[str, float]:
    """Seconds per group from a ``--durations=0`` listing (every phase of every test)."""
    seconds: defaultdict[str, float] = defaultdict(float)
    for line in log.splitlines():
        found = re.match(r"\s*([0-9.]+)s (?:setup|call|teardown)\s+(\S+)", line)
        if found:
            seconds[group_of(found[2])] += float(found[1])
    return {group: round(s, 1) for group, s in sorted(seconds.items())}


if __name__ == "__main__":
    by_group = durations_by_group(Path(sys.argv[1]).read_text(errors="replace"))
    DURATIONS.write_text(json.dumps(by_group, indent=1) + "\n")
    print(f"{DURATIONS}: {len(by_group)} groups, {sum(by_group.values()):.0f} s")
