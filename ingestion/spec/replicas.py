"""A pipeline's MirrorMaker 2 replicas, as the pipeline spec declares them (``replicas:``).

The cluster itself (bootstrap servers, security) is in the platform configuration under
``replicas.<name>``; the spec says how MM2 names the pipeline's topics there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_ALIAS = r"^[A-Za-z0-9._-]+$"


class ReplicaSpec(BaseModel):
    """One replica of the pipeline's topics, written by MM2 from the primary cluster.

    ``source_alias`` and ``replication_policy`` are MM2's for the primary -> replica flow
    (copies named ``<alias>.<topic>`` under ``default``, ``<topic>`` under ``identity``).
    The ``failback_*`` keys describe the reverse flow (replica -> primary) a failback reads:
    its source alias (default: the replica's name) and its policy (default ``identity``).
    ``target_alias`` is the replica's alias in MM2 (it names the offset-syncs topic on the
    primary, ``mm2-offset-syncs.<alias>.internal``); unset, a failover uses checkpoints only.

    Example:
        >>> ReplicaSpec(name="dr", source_alias="primary").failback_alias
        'dr'
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    source_alias: str = Field(pattern=_ALIAS)
    replication_policy: Literal["default", "identity"] = "default"
    target_alias: str | None = Field(default=None, pattern=_ALIAS)
    failback_source_alias: str | None = Field(default=None, pattern=_ALIAS)
    failback_replication_policy: Literal["default", "identity"] = "identity"
    max_checkpoint_age_seconds: float = Field(default=300.0, gt=0)

    @field_validator("name")
    @classmethod
    def _not_primary(cls, name: str) -> str:
        # 'primary' names the pipeline's own cluster: in the rows' _kafka_cluster, in switch
        # properties (kafka.failover-to) and in `platform failover --to primary`.
        if name == "primary":
            raise ValueError(
                "replica name 'primary' is reserved for the pipeline's own cluster (the "
                "kafka section); name the replica after its cluster, e.g. dr"
            )
        return name

    @model_validator(mode="after")
    def _reverse_flow_can_exist(self) -> ReplicaSpec:
        # MM2's DefaultReplicationPolicy never copies a topic back to the cluster its name
        # says it came from (MirrorSourceConnector.isCycle): ``primary.orders`` on the replica
        # is not replicated to ``primary``, so the reverse copy a failback reads never exists.
        if self.replication_policy == "default" and self.failback_replication_policy == "default":
            raise ValueError(
                f"replica {self.name!r}: replication_policy default with "
                "failback_replication_policy default cannot fail back: MirrorMaker 2 does not "
                f"copy '{self.source_alias}.<topic>' back to the cluster aliased "
                f"{self.source_alias!r} (a cycle). Use failback_replication_policy: identity, or "
                "replication_policy: identity with failback_replication_policy: default"
            )
        return self

    @property
    def failback_alias(self) -> str:
        """The reverse flow's source alias (MM2's name for this replica cluster)."""
        return self.failback_source_alias or self.name
