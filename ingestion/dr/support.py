"""Disaster recovery as the core asks for it: the add-on's side of ``ingestion.replicas``.

The core loads this module only for a pipeline that declares ``replicas:``
(:func:`ingestion.replicas.replica_support`); everything a run does differently on a route
with replicas starts here: the route checks of R49 (``ingestion.dr.route``), the late-copy
guard of R54 as the tasks' record guard (``ingestion.dr.late_copies``), the route each commit
carries, and the topic-name families of the full audit (``ingestion.dr.audit_names``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ingestion.dr.audit_names import name_families
from ingestion.dr.late_copies.guard import LateCopyGuard, WeakId, read_guard
from ingestion.dr.late_copies.task import LateCopyScreen
from ingestion.dr.route import carried_route, refuse_ended_topics, refuse_other_cluster

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from ingestion.kafka.ranges import Key
    from ingestion.spec.pipeline import PipelineSpec
    from ingestion.task.spec import RecordGuard


@dataclass(frozen=True)
class LateCopyRunGuard:
    """The run's side of the late-copy guard (a ``RunGuard``): each task gets its partition's
    (timestamp, key digest) pairs; candidates are resolved by reading, on the clusters the
    guard's entries name, the records they may copy."""

    guard: LateCopyGuard
    cluster_config: Callable[[str], dict[str, Any]] | None

    def task_guards(self) -> dict[Key, RecordGuard]:
        """A :class:`LateCopyScreen` per replica partition holding uncopied records."""
        return {key: LateCopyScreen(weak) for key, weak in self.guard.weak_ids().items() if weak}

    def resolve(self, met: dict[Key, set[Hashable]]) -> dict[Key, RecordGuard]:
        """Screens with the byte-for-byte identities of the records the candidates met.

        Raises:
            LateCopyUnverifiedError: a cluster needed is not configured or does not answer.
        """
        weak = self.guard.weak_ids()
        pairs = {key: cast("set[WeakId]", found) for key, found in met.items()}
        digests = self.guard.digests(self.cluster_config, pairs)
        return {key: LateCopyScreen(weak[key], strong) for key, strong in digests.items()}


class DisasterRecovery:
    """:class:`ingestion.replicas.ReplicaSupport` for a pipeline with replicas."""

    def check_route(
        self, table: Table, group_id: str, spec: PipelineSpec, planned: list[str], cluster: str
    ) -> None:
        """A run planned on a route a failback's completion ended, or told another cluster
        than the route's, is refused (R49): nothing read, nothing committed."""
        unplanned = [t for t in spec.source_topics if t not in planned]
        refuse_ended_topics(table, group_id, spec.source_topics, unplanned, spec.name)
        self.check_cluster(table, group_id, spec, cluster)  # rows record it

    def check_cluster(self, table: Table, group_id: str, spec: PipelineSpec, cluster: str) -> None:
        """A run told another cluster than the route's is refused (a switch landed since)."""
        refuse_other_cluster(table, group_id, cluster, spec.name)

    def run_guard(
        self,
        table: Table,
        group_id: str,
        pipeline: str,
        cluster_config: Callable[[str], dict[str, Any]] | None,
    ) -> LateCopyRunGuard | None:
        """The late-copy guard of the route in force (R54), or None."""
        guard = read_guard(table, group_id, pipeline)
        return LateCopyRunGuard(guard, cluster_config) if guard is not None else None

    def commit_properties(self, table: Table, group_id: str) -> dict[str, str]:
        """A moved route outlives the expiry of its switch (R49)."""
        return carried_route(table, group_id)

    def name_families(self, spec: PipelineSpec) -> list[frozenset[str]]:
        """Every name each spec topic is read under across the replicas."""
        return name_families(spec)
