"""Named failure points of a run, for tests that crash or stall it (rule 6).

Production runs use :data:`NO_HOOKS`. A test passes a :class:`FailureHooks` whose callables
raise (a crash) or sleep (a stall) at a point; executors receive it pickled with their task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

HookPoint = Literal[
    "after_plan",
    "in_task",
    "before_commit",
    "before_catalog_call",
    "after_catalog_call",
    "after_commit",
    "before_mirror",
    "before_compaction_commit",
    "before_expiry_commit",
]
HOOK_POINTS: tuple[HookPoint, ...] = get_args(HookPoint)
# Points of a maintenance pass (ingestion.ops.maintenance), not of a run.
MAINTENANCE_HOOK_POINTS: tuple[HookPoint, ...] = (
    "before_compaction_commit",
    "before_expiry_commit",
)
RUN_HOOK_POINTS: tuple[HookPoint, ...] = tuple(
    point for point in HOOK_POINTS if point not in MAINTENANCE_HOOK_POINTS
)


@dataclass(frozen=True)
class FailureHooks:
    """Callables invoked at named points; each gets the point name and context keywords."""

    hooks: dict[str, Callable[..., Any]]

    def fire(self, point: HookPoint, **context: Any) -> None:
        """Call the hook registered for ``point``, if any."""
        hook = self.hooks.get(point)
        if hook is not None:
            hook(point, **context)

    def only(self, *points: HookPoint) -> FailureHooks:
        """The hooks of ``points`` alone (executors receive only ``in_task``)."""
        return FailureHooks({p: h for p, h in self.hooks.items() if p in points})


NO_HOOKS = FailureHooks({})
