"""A pipeline's declared MM2 replicas (``replicas:``), validated on their own: the defaults,
the reserved name ``primary``, the policy pair whose reverse flow MM2 never copies, and the
reverse flow's alias."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ingestion.spec.replicas import ReplicaSpec


def test_defaults_describe_mm2s_default_naming_and_an_identity_reverse_flow() -> None:
    replica = ReplicaSpec(name="dr", source_alias="primary")
    assert replica.replication_policy == "default"
    assert replica.failback_replication_policy == "identity"
    assert replica.target_alias is None  # a failover uses checkpoints only
    assert replica.failback_alias == "dr"  # the reverse flow's source: the replica's name
    assert replica.max_checkpoint_age_seconds == 300.0


def test_the_reverse_flows_alias_can_be_named() -> None:
    replica = ReplicaSpec(name="dr", source_alias="primary", failback_source_alias="dr-east")
    assert replica.failback_alias == "dr-east"


def test_primary_is_reserved_for_the_pipelines_own_cluster() -> None:
    with pytest.raises(ValidationError, match="replica name 'primary' is reserved"):
        ReplicaSpec(name="primary", source_alias="main")


def test_default_naming_both_ways_is_refused_because_mm2_never_copies_it_back() -> None:
    with pytest.raises(ValidationError, match="cannot fail back") as raised:
        ReplicaSpec(name="dr", source_alias="main", failback_replication_policy="default")
    assert "'main.<topic>'" in str(raised.value)  # names the topic MM2 will not copy back
    # identity one way and default the other is fine, in either order.
    ReplicaSpec(
        name="dr",
        source_alias="main",
        replication_policy="identity",
        failback_replication_policy="default",
    )
    ReplicaSpec(name="dr", source_alias="main", replication_policy="identity")


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "DR"},  # names start lower-case
        {"name": "1dr"},
        {"source_alias": "has space"},
        {"target_alias": "a/b"},
        {"replication_policy": "custom"},
        {"max_checkpoint_age_seconds": 0},
        {"bootstrap_servers": "b:9092"},  # the cluster is platform configuration, not spec
    ],
    ids=["upper", "digit", "alias-space", "alias-slash", "policy", "age", "extra"],
)
def test_invalid_fields_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ReplicaSpec(**{"name": "dr", "source_alias": "primary", **fields})


def test_a_replica_spec_is_frozen() -> None:
    replica = ReplicaSpec(name="dr", source_alias="primary")
    with pytest.raises(ValidationError):
        replica.name = "other"
