"""Which worker runs what under pytest-xdist (``make test``: ``-n 2 --dist loadgroup``).

Every test gets an ``xdist_group``: the users of a shared session server one group each
(:data:`SHARED_GROUPS`: the one `make dev` stack), any other test its module's, so that a module's
fixtures (a cluster pair, a Spark cluster, a bench run) start once, on the one worker that runs
the module, in the order collected. The groups are handed out longest first
(``--no-loadscope-reorder`` keeps this order): a long group started last would run on alone while
the other worker idles. How long a group takes comes from ``tests/durations.json``, written from a
full run's ``--durations=0`` listing by ``python -m tests.support.suite_order LOG``; a group not in
it (a new module) counts as :data:`UNKNOWN_S`. A stale file only makes the schedule worse, never a
test wrong: the order inside a group is the collection's.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SHARED_GROUPS = ("dev_stack",)
"""Session fixtures whose users run on one worker, wherever their modules are."""

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
UNKNOWN_S = 30.0
"""The seconds assumed for a group missing from the durations file."""


def group_of(item: pytest.Item) -> str:
    """The item's group: the first shared fixture it uses, else its module's path."""
    fixtures = set(getattr(item, "fixturenames", ()))
    shared = [name for name in SHARED_GROUPS if name in fixtures]
    return shared[0] if shared else item.nodeid.split("::")[0]


def group_and_order(items: list[pytest.Item]) -> None:
    """Mark every item with its group, then order the groups longest first, each group's items
    in the order they had."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    groups = [group_of(item) for item in items]
    for item, group in zip(items, groups, strict=True):
        item.add_marker(pytest.mark.xdist_group(group))
    position = {group: n for n, group in reversed(list(enumerate(groups)))}
    ranked = sorted(
        range(len(items)),
        key=lambda n: (-known.get(groups[n], UNKNOWN_S), position[groups[n]], n),
    )
    items[:] = [items[n] for n in ranked]


def durations_by_group(log: str, dev_stack_modules: tuple[str, ...]) -> dict[str, float]:
    """Seconds per group from a ``--durations=0`` listing (every phase of every test)."""
    seconds: defaultdict[str, float] = defaultdict(float)
    for line in log.splitlines():
        found = re.match(r"\s*([0-9.]+)s (?:setup|call|teardown)\s+(\S+)", line)
        if found:
            module = found[2].split("::")[0].split("@")[0]
            shared = Path(module).name in dev_stack_modules
            seconds["dev_stack" if shared else module] += float(found[1])
    return {group: round(s, 1) for group, s in sorted(seconds.items())}


if __name__ == "__main__":
    from tests.support.dev_stack import DEV_STACK_ORDER

    by_group = durations_by_group(Path(sys.argv[1]).read_text(errors="replace"), DEV_STACK_ORDER)
    DURATIONS.write_text(json.dumps(by_group, indent=1) + "\n")
    print(f"{DURATIONS}: {len(by_group)} groups, {sum(by_group.values()):.0f} s")
