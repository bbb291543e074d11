"""The DR drill's Dagster path (scripts/dr_dagster.py): real runs of the ingestion and failover
jobs on a real instance, counted by outcome with the error class of the run's failure event."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from dagster import DagsterInstance, Definitions

from platform_assets.dr.jobs import build_failover_job
from platform_assets.ingest.assets import build_pipeline_assets
from platform_assets.ingest.checks import build_pipeline_checks
from platform_assets.ingest.jobs import build_ingest_job
from platform_assets.operations.jobs import build_ops_jobs
from resources.iceberg import IcebergCatalogResource
from tests.support.pipelines import NewPipeline, make_spec
from tests.support.scripts import load_script


def load_helper() -> ModuleType:
    """scripts/dr_dagster.py, which the drill imports as a module beside it."""
    return load_script("dr_dagster")


def test_job_config_is_the_cli_command() -> None:
    helper = load_helper()
    assert helper.job_config(["failover", "orders", "--to", "primary", "--reason", "back"]) == {
        "complete": False,
        "source_lost": False,
        "to": "primary",
        "reason": "back",
    }


@pytest.mark.integration
def test_runs_counted_by_outcome_and_error_class(
    resources: dict[str, Any], new_pipeline: NewPipeline, catalog_resource: IcebergCatalogResource
) -> None:
    helper = load_helper()
    _, spec = new_pipeline("drdrill", produce=20)
    missing = make_spec("drdrill-no-such-topic", "drdrill_missing")
    defs = Definitions(
        assets=[*build_pipeline_assets(spec), *build_pipeline_assets(missing)],
        asset_checks=[build_pipeline_checks(spec), build_pipeline_checks(missing)],
        jobs=[
            build_ingest_job(spec),
            build_ingest_job(missing),
            *build_ops_jobs([spec]),
            build_failover_job([spec]),
        ],
        resources=resources,
    )
    catalog = catalog_resource.load_catalog()
    with DagsterInstance.ephemeral() as instance:
        path = helper.DagsterPath(defs, instance, spec)
        outcome, snapshot_id = path.ingest()
        assert outcome == "dagster run success: committed"
        current = catalog.load_table(spec.table).current_snapshot()
        assert current is not None
        assert snapshot_id == current.snapshot_id
        assert len(catalog.load_table(spec.table).scan().to_arrow()) == 20
        assert path.ingest() == ("dagster run success: nothing new", None)

        # A refused failover: the op's Failure, with the reason the CLI would print.
        with pytest.raises(helper.Refused, match=r"^run \S+: Failure: pipeline 'drdrill'.*'dr'"):
            path.operate({"to": "dr", "reason": "drill"})

        # An ingestion run that fails: the op's own exception class, not Dagster's wrapper.
        failing = helper.DagsterPath(defs, instance, missing)
        outcome, snapshot_id = failing.ingest()
        assert snapshot_id is None
        assert outcome.startswith("dagster run failure: ")
        assert "DagsterExecutionStepExecutionError" not in outcome
        failures = {**path.failures, **failing.failures}
        assert set(failures) == {
            "failover: Failure",
            f"ingest_drdrill_missing_job: {outcome.removeprefix('dagster run failure: ')}",
        }
        assert all(text.startswith("run ") for text in failures.values())


def test_describe_topic_timeout_names_the_topic() -> None:
    """A cluster that does not answer (the drill's SIGSTOPped primary) fails the ingestion
    asset's group check in describe_topic: the error names the topic, not a bare TimeoutError."""
    import socket

    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

    from ingestion.kafka.topics import describe_topic

    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        bootstrap = f"127.0.0.1:{silent.getsockname()[1]}"
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "drill-timeout"})
        try:
            with pytest.raises(TimeoutError, match=r"^topic 'orders': the Kafka cluster did not"):
                describe_topic(
                    AdminClient({"bootstrap.servers": bootstrap}), consumer, "orders", 1.0
                )
        finally:
            consumer.close()
