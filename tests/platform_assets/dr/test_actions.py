"""The CLI's disaster-recovery commands (``run_dr_action``) without Kafka: a release of the
late-copy record on a real embedded catalog says how many records it released and where they
were read; an applied switch counts the active runs first and prints that line before the
switch's own, a dry run counts nothing."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
import pytest

from ingestion.dr.late_copies.guard import UNCOPIED_PREFIX
from ingestion.exceptions import FailoverRefusedError, OperationRefusedError
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import FAILOVER_TO, TopicOffsets, commit_properties
from ingestion.table.schema import load_or_create_table
from platform_assets.dr.actions import run_dr_action
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.pipelines import make_spec

SPEC = make_spec("orders", "dr_cli", replicas=[{"name": "dr", "source_alias": "primary"}])
KAFKA = KafkaResource(bootstrap_servers="nowhere:1")  # no replica configured
GUARD = {
    "to": "dr",
    "partitions": [
        {
            "topic": "primary.orders",
            "partition": 0,
            "from": "primary",
            "source_topic": "orders",
            "records": [[3, 1000, "a"], [4, 1001, "b"]],
        },
    ],
}


@pytest.fixture
def iceberg(tmp_path: Path) -> IcebergCatalogResource:
    return IcebergCatalogResource(state_dir=str(tmp_path))


def args(command: str, **fields: object) -> argparse.Namespace:
    defaults = {"by": "ops", "reason": "drill", "apply": False, "to": "dr", "source_lost": False}
    return argparse.Namespace(command=command, **{**defaults, **fields})


class Counted:
    """``count_runs``: records each call and answers no active run."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, spec: PipelineSpec, iceberg: IcebergCatalogResource) -> tuple[int, str]:
        self.calls.append(spec.name)
        return 0, "0 active ingestion run(s) counted"


def test_a_release_says_how_many_records_it_released_and_where(
    iceberg: IcebergCatalogResource,
) -> None:
    table = load_or_create_table(iceberg.load_catalog(), SPEC)
    properties = commit_properties(
        group_id=SPEC.consumer_group_id,
        offsets={"orders": TopicOffsets("id", {0: 5})},
        commit_id="switch",
        cluster_id="k-dr",
        pipeline=SPEC.name,
    )
    with table.transaction() as transaction:
        transaction.set_properties(
            {UNCOPIED_PREFIX + SPEC.consumer_group_id: orjson.dumps(GUARD).decode()}
        )
        with transaction.update_snapshot(
            snapshot_properties={**properties, FAILOVER_TO: "dr"}
        ).fast_append():
            pass
    counted = Counted()
    dry = run_dr_action(args("release-late-copies"), SPEC, KAFKA, iceberg, counted)
    assert dry == [
        "would release the 2 uncopied record(s) of 'dr_cli''s route (2 read on 'primary')",
        "dry run: nothing committed (add --apply)",
    ]
    lines = run_dr_action(args("release-late-copies", apply=True), SPEC, KAFKA, iceberg, counted)
    assert lines == [
        "released the 2 uncopied record(s) of 'dr_cli''s route (2 read on 'primary'; by 'ops', "
        "reason 'drill'): runs no longer skip or wait for the late copies of any of them"
    ]
    assert counted.calls == []
    with pytest.raises(OperationRefusedError, match="no record of uncopied records is in force"):
        run_dr_action(args("release-late-copies", apply=True), SPEC, KAFKA, iceberg, counted)


def test_an_applied_switch_counts_the_active_runs_first_and_a_dry_run_does_not(
    iceberg: IcebergCatalogResource,
) -> None:
    """The replica is not configured: the switch itself is refused before anything is read."""
    counted = Counted()
    with pytest.raises(FailoverRefusedError, match="no replica cluster 'dr'"):
        run_dr_action(args("failover"), SPEC, KAFKA, iceberg, counted)
    assert counted.calls == []
    with pytest.raises(FailoverRefusedError, match="no replica cluster 'dr'"):
        run_dr_action(args("failover", apply=True), SPEC, KAFKA, iceberg, counted)
    assert counted.calls == ["dr_cli"]
