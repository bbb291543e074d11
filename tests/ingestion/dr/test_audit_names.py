"""The topic-name families of the full audit's cross-name check: every name MM2 gives a spec
topic under the pipeline's replicas (its copy, and the reverse copies a failback reads), per
replication policy and alias; none without replicas."""

from __future__ import annotations

from typing import Any

import pytest

from ingestion.dr.audit_names import name_families
from tests.support.pipelines import make_spec


def test_a_pipeline_without_replicas_has_no_families() -> None:
    assert name_families(make_spec("orders", "plain")) == []


@pytest.mark.parametrize(
    ("replicas", "family"),
    [
        # default forward (primary.orders), identity back: the copy's name comes back as is.
        ([{"name": "dr", "source_alias": "primary"}], {"orders", "primary.orders"}),
        # identity forward, default back: the reverse copy is dr.orders on the primary.
        (
            [
                {
                    "name": "dr",
                    "source_alias": "primary",
                    "replication_policy": "identity",
                    "failback_replication_policy": "default",
                }
            ],
            {"orders", "dr.orders"},
        ),
        # ... named after the reverse flow's alias when it has its own.
        (
            [
                {
                    "name": "dr",
                    "source_alias": "primary",
                    "replication_policy": "identity",
                    "failback_replication_policy": "default",
                    "failback_source_alias": "west",
                }
            ],
            {"orders", "west.orders"},
        ),
        # Two replicas: one family with every name.
        (
            [
                {"name": "dr", "source_alias": "primary"},
                {
                    "name": "dr2",
                    "source_alias": "main",
                    "replication_policy": "identity",
                    "failback_replication_policy": "default",
                },
            ],
            {"orders", "primary.orders", "dr2.orders"},
        ),
    ],
    ids=["default", "identity", "failback-alias", "two-replicas"],
)
def test_each_topic_has_one_family_of_every_name_mm2_gives_it(
    replicas: list[dict[str, Any]], family: set[str]
) -> None:
    spec = make_spec("orders", "fam", replicas=replicas)
    assert name_families(spec) == [frozenset(family)]


def test_a_family_per_topic_and_none_for_a_name_that_never_changes() -> None:
    """Identity naming both ways keeps one name: nothing to compare across names."""
    spec = make_spec(
        "x",
        "many",
        topics=["orders", "payments"],
        replicas=[{"name": "dr", "source_alias": "primary"}],
    )
    assert name_families(spec) == [
        frozenset({"orders", "primary.orders"}),
        frozenset({"payments", "primary.payments"}),
    ]
    same = make_spec(
        "orders",
        "same",
        replicas=[{"name": "dr", "source_alias": "primary", "replication_policy": "identity"}],
    )
    assert name_families(same) == []
