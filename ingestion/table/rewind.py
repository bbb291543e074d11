"""Recorded rewinds and retired groups: what the table says about positions it left behind.

The Kafka group mirrors the table's offsets (rule 5). Ordinary commits move it forward only (R8).
It may move backwards only from a position the table itself vouches for as left behind
(:func:`find_rewinds`), and then only to the table's current offsets:

- the offsets of a commit of this group that is no longer in the current ancestry: the table was
  rolled back or its current snapshot set by another tool (R32);
- the offsets of a commit of this group older than an operator action (a snapshot carrying
  ``kafka.reset-by``: reset or migration) in the current ancestry (R48);
- the Kafka group offsets an operator action recorded as the ones it replaced
  (``kafka.group-offsets-before``).

Why a paused ("zombie") coordinator cannot use this to move the group backwards: the mirror's
target is always the table's offsets read at mirror time, never the run's own plan, so the group
can only be set to where the table is. It is moved back only while its current offsets equal a
left-behind position; offsets mirrored from the live lineage after the newest action are at or
below the table's and only ever move forward. At worst a zombie that read the table just before a
newer commit writes the older head: the group is then behind the table (a WARN the next run
repairs), never ahead of it. Offsets nothing here explains are a foreign writer's: never moved
back over, and the group check names them as such.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ingestion import exceptions
from ingestion.kafka.ranges import Key
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import (
    GROUP_ID,
    GROUP_OFFSETS_BEFORE,
    MIGRATED_FROM,
    OFFSETS_PREFIX,
    RESET_BY,
    RETIRED_GROUPS,
    decode_offsets,
    decode_positions,
    describe_commit,
    flatten,
    iter_ancestry,
    snapshot_properties,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table


@dataclass(frozen=True)
class RewindSource:
    """Offsets the table once held for the group and has since left behind, and why."""

    snapshot_id: int
    offsets: dict[Key, int]
    kind: Literal["rollback", "operator"]
    cause: str


@dataclass(frozen=True)
class Retirement:
    """The group migration that retired a group: its snapshot, the successor group, named."""

    snapshot_id: int
    group_id: str
    successor: str
    description: str


def retired_groups(properties: dict[str, str]) -> set[str]:
    """The group ids a snapshot's migration retired (none for any other snapshot); a migration
    written before ``kafka.retired-groups`` existed retired its ``kafka.migrated-from`` group.

    Example:
        >>> sorted(retired_groups({RETIRED_GROUPS: "a,b"})), retired_groups({MIGRATED_FROM: "c"})
        (['a', 'b'], {'c'})
    """
    retired = {group for group in properties.get(RETIRED_GROUPS, "").split(",") if group}
    return retired | ({properties[MIGRATED_FROM]} if MIGRATED_FROM in properties else set())


def find_retirement(table: Table, group_id: str) -> Retirement | None:
    """The migration that retired ``group_id``, unless a later snapshot of the current ancestry
    committed offsets for the group again (an explicit reset brings a retired group back)."""
    key = OFFSETS_PREFIX + group_id
    for snapshot in iter_ancestry(table):
        properties = snapshot_properties(snapshot)
        if key in properties:
            return None
        if group_id in retired_groups(properties):
            return Retirement(
                snapshot.snapshot_id,
                group_id,
                properties.get(GROUP_ID, ""),
                describe_commit(snapshot.snapshot_id, properties),
            )
    return None


def check_not_retired(spec: PipelineSpec, table: Table) -> None:
    """Refuse a group id that a migration retired (its offsets in the table are stale, R22).

    Raises:
        RetiredGroupError: naming the migration (who, why, snapshot) and both fixes.
    """
    retirement = find_retirement(table, spec.consumer_group_id)
    if retirement is None:
        return
    group, successor = spec.consumer_group_id, retirement.successor
    raise exceptions.RetiredGroupError(
        f"pipeline {spec.name!r}: group {group!r} was retired by the {retirement.description}. "
        f"Its offsets in table {spec.table} are stale ({successor!r} carries on from them): "
        f"refusing to plan under it. Fix: set consumer_group_id: {successor}; if you really "
        f"mean to reuse {group!r}, reset its offsets explicitly first (platform reset "
        f"{spec.name} --to ... --apply)."
    )


def find_rewinds(table: Table, group_id: str) -> list[RewindSource]:
    """Every position of ``group_id`` the table left behind (see the module docstring).

    Reads table metadata only (every snapshot still in it); callers read it only when the Kafka
    group is ahead of the table.
    """
    key = OFFSETS_PREFIX + group_id
    lineage = list(iter_ancestry(table))
    sources: list[RewindSource] = []
    action: str | None = None  # the nearest operator action newer than the snapshot at hand
    for snapshot in lineage:  # newest first
        properties = snapshot_properties(snapshot)
        if key not in properties:
            continue
        if action is not None:
            offsets = flatten(decode_offsets(properties[key]))
            cause = f"the {action} moved the table's offsets away from them"
            sources.append(RewindSource(snapshot.snapshot_id, offsets, "operator", cause))
        if RESET_BY in properties:
            action = describe_commit(snapshot.snapshot_id, properties)
            if GROUP_OFFSETS_BEFORE in properties:
                replaced = decode_positions(properties[GROUP_OFFSETS_BEFORE])
                cause = f"the {action} recorded them as the Kafka group's offsets it replaced"
                sources.append(RewindSource(snapshot.snapshot_id, replaced, "operator", cause))
    live = {snapshot.snapshot_id for snapshot in lineage}
    for snapshot in table.metadata.snapshots:
        properties = snapshot_properties(snapshot)
        if snapshot.snapshot_id in live or key not in properties:
            continue
        cause = (
            f"the table was rolled back: {describe_commit(snapshot.snapshot_id, properties)} "
            "is no longer in its current lineage"
        )
        offsets = flatten(decode_offsets(properties[key]))
        sources.append(RewindSource(snapshot.snapshot_id, offsets, "rollback", cause))
    return sources


def explain_ahead(
    group_offsets: dict[Key, int], ahead: Iterable[Key], sources: Sequence[RewindSource]
) -> RewindSource | None:
    """The first left-behind position the group is at: equal on every partition both hold, and
    holding every partition where the group is ahead of the table (a pure function).

    Example:
        >>> left = RewindSource(1, {("t", 0): 30}, "rollback", "rolled back")
        >>> explain_ahead({("t", 0): 30}, [("t", 0)], [left]).cause
        'rolled back'
        >>> explain_ahead({("t", 0): 31}, [("t", 0)], [left]) is None
        True
    """
    wanted = list(ahead)
    for source in sources:
        if all(k in source.offsets for k in wanted) and all(
            source.offsets[k] == o for k, o in group_offsets.items() if k in source.offsets
        ):
            return source
    return None


@dataclass(frozen=True)
class MirrorPlan:
    """Which partitions of the group move forward, which move back (and why), which are left."""

    forward: dict[Key, int] = field(default_factory=dict)
    back: dict[Key, int] = field(default_factory=dict)
    left_ahead: dict[Key, int] = field(default_factory=dict)
    because: RewindSource | None = None

    @property
    def moves(self) -> dict[Key, int]:
        """Every offset to commit to the group."""
        return {**self.forward, **self.back}


def plan_mirror(
    table_offsets: dict[Key, int],
    group_offsets: dict[Key, int],
    sources: Sequence[RewindSource] = (),
) -> MirrorPlan:
    """Where the group goes: forward to the table's offsets wherever it is behind; back to them
    only where it is ahead at a left-behind position (a pure function).

    Example:
        >>> plan_mirror({("t", 0): 20}, {("t", 0): 10}).forward
        {('t', 0): 20}
        >>> plan_mirror({("t", 0): 5}, {("t", 0): 30}).left_ahead  # nothing explains 30
        {('t', 0): 30}
        >>> left = RewindSource(1, {("t", 0): 30}, "operator", "reset")
        >>> plan_mirror({("t", 0): 5}, {("t", 0): 30}, [left]).back
        {('t', 0): 5}
    """
    forward = {k: o for k, o in table_offsets.items() if o > group_offsets.get(k, -1)}
    ahead = {k: group_offsets[k] for k, o in table_offsets.items() if group_offsets.get(k, -1) > o}
    if not ahead:
        return MirrorPlan(forward)
    because = explain_ahead(group_offsets, ahead, sources)
    if because is None:
        return MirrorPlan(forward, left_ahead=ahead)
    return MirrorPlan(forward, {k: table_offsets[k] for k in ahead}, because=because)
