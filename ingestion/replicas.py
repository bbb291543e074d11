"""A pipeline's replicas as the core sees them: the one door into disaster recovery.

Disaster recovery (MirrorMaker 2 failover, failback, late copies, replica checks:
``ingestion.dr``) is an add-on. The core (the run, its tasks, the audit) never imports
``ingestion.dr``; it asks :func:`replica_support`, which answers None for a pipeline that
declares no ``replicas:`` (and then nothing of ``ingestion.dr`` is imported, in the driver or
on an executor) and otherwise loads the add-on's :class:`ReplicaSupport`. What the add-on can
change is exactly what this protocol names: the run's route checks, a record guard on the tasks
(``ingestion.task.spec``), properties a commit carries, and the audit's topic-name families.
``tests/test_layout.py`` enforces the boundary, and that a run without replicas loads no
``ingestion.dr`` module.

What a table records about a route (which cluster and topic names a group reads) is part of the
table's format and read by the core: ``ingestion.table.route``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from ingestion.spec.pipeline import PipelineSpec
    from ingestion.task.spec import RunGuard


class ReplicaSupport(Protocol):
    """What disaster recovery adds to a pipeline that declares replicas."""

    def check_route(
        self,
        table: Table,
        group_id: str,
        spec: PipelineSpec,
        planned: list[str],
        cluster: str,
    ) -> None:
        """Refuse a run planned on a route that changed since (``planned``: the topics it has
        offsets for; ``cluster``: the cluster it was told it reads). Raises an
        ``IngestionError`` before anything is read; nothing is committed."""
        ...

    def check_cluster(self, table: Table, group_id: str, spec: PipelineSpec, cluster: str) -> None:
        """Refuse a run told it reads ``cluster`` while the table's route reads another
        (``RouteClusterError``): a switch landed since the caller read the route."""
        ...

    def run_guard(
        self,
        table: Table,
        group_id: str,
        pipeline: str,
        cluster_config: Callable[[str], dict[str, Any]] | None,
    ) -> RunGuard | None:
        """The record guard of this run's tasks, or None when no record is held back."""
        ...

    def commit_properties(self, table: Table, group_id: str) -> dict[str, str]:
        """Snapshot properties a run commit carries (a moved route outlives its switch)."""
        ...

    def name_families(self, spec: PipelineSpec) -> list[frozenset[str]]:
        """The names one topic has across the replicas (the audit's cross-name check)."""
        ...


def replica_support(spec: PipelineSpec) -> ReplicaSupport | None:
    """Disaster recovery for ``spec``: None without ``replicas:`` (nothing imported).

    Example:
        >>> import sys
        >>> from ingestion.spec.pipeline import parse_pipeline_spec
        >>> spec = parse_pipeline_spec({"name": "p", "topic": "orders", "table": "n.t",
        ...     "consumer_group_id": "g", "value_format": "raw"})
        >>> replica_support(spec) is None
        True
    """
    if not spec.replicas:
        return None
    # The seam's one import of the add-on (tests/test_layout.py allows it here only).
    from ingestion.dr.support import DisasterRecovery

    return DisasterRecovery()
