"""dbt on the ingested table: the mart's figures match the producer's ledger, incremental
builds add exactly the new records, and a failing dbt test fails its asset check."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
from dagster import AssetKey, materialize

from ingestion.pipeline.run import run_pipeline
from ingestion.spec.pipeline import PipelineSpec, load_pipeline_specs
from platform_assets.dbt.assets import build_dbt_assets, dbt_resource, load_dbt_project
from platform_assets.demo import encode_event, make_order_event
from platform_assets.pipelines import PIPELINES_FILE
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource
from tests.support.ledger import LedgerEntry, LedgerProducer, Record
from tests.support.pipelines import CreateTopic

pytestmark = pytest.mark.integration
DAY = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private catalog + DuckDB file; dbt finds them through PLATFORM_STATE_DIR."""
    monkeypatch.setenv("PLATFORM_STATE_DIR", str(tmp_path))
    return tmp_path


def demo_spec(topic: str) -> PipelineSpec:
    (orders,) = load_pipeline_specs(PIPELINES_FILE)
    return orders.model_copy(update={"topic": topic})


def orders(first: int, count: int, duplicates: int, seed: int) -> list[Record]:
    rng = random.Random(seed)
    events = [make_order_event(rng, i, now=DAY) for i in range(first, first + count)]
    produced: list[Record] = [(e["order_id"].encode(), encode_event(e), None) for e in events]
    return produced + produced[:duplicates]  # deliberate upstream duplicates (retries)


def expected_revenue(entries: list[LedgerEntry]) -> dict[tuple[str, str], tuple[int, Decimal]]:
    """(currency, status) -> (orders, revenue) after keeping each order's first occurrence."""
    first: dict[str, dict[str, Any]] = {}
    for entry in sorted(entries, key=lambda e: (e.timestamp_ms, e.partition, e.offset)):
        event = orjson.loads(entry.value or b"{}")
        first.setdefault(event["order_id"], event)
    totals: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, Decimal(0)])
    for event in first.values():
        key = (event["currency"], event["status"])
        totals[key][0] += 1
        totals[key][1] += Decimal(str(event["amount"]))
    return {key: (n, revenue) for key, (n, revenue) in totals.items()}


Ingest = Callable[[PipelineSpec], int]


@pytest.fixture
def ingest(state_dir: Path, kafka: KafkaResource, spark_resource: SparkResource) -> Ingest:
    """Run a pipeline into the catalog of ``state_dir``; return the records it committed."""

    def _ingest(spec: PipelineSpec) -> int:
        catalog = IcebergCatalogResource(state_dir=str(state_dir)).load_catalog()
        report = run_pipeline(
            spec,
            kafka.client_config(),
            catalog,
            spark_resource.spark_session,
            kafka.get_cluster_id(),
        )
        return report.records

    return _ingest


def build_dbt() -> Any:
    project = load_dbt_project()
    return materialize(
        [build_dbt_assets(project)], resources={"dbt": dbt_resource(project)}, raise_on_error=False
    )


def query(state_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(state_dir / "analytics.duckdb"), read_only=True) as connection:
        return connection.execute(sql).fetchall()


def mart_totals(state_dir: Path) -> dict[tuple[str, str], tuple[int, Decimal]]:
    sql = "select currency, status, sum(orders), sum(revenue) from daily_revenue group by 1, 2"
    return {(c, s): (n, r) for c, s, n, r in query(state_dir, sql)}


def test_mart_matches_ledger_and_incremental_adds_exactly_the_new_records(
    state_dir: Path, ingest: Ingest, create_topic: CreateTopic, ledger_producer: LedgerProducer
) -> None:
    topic = create_topic(partitions=3)
    spec = demo_spec(topic)
    first = ledger_producer.produce(topic, orders(0, 120, duplicates=7, seed=1))
    assert ingest(spec) == 127  # the table keeps both offsets
    result = build_dbt()
    assert result.success
    assert all(e.passed for e in result.get_asset_check_evaluations())
    assert mart_totals(state_dir) == expected_revenue(first)
    assert query(state_dir, "select count(*) from orders_incremental") == [(120,)]

    second = ledger_producer.produce(topic, orders(120, 30, duplicates=3, seed=2))
    assert ingest(spec) == 33
    assert build_dbt().success
    assert query(
        state_dir, "select count(*), count(distinct order_id) from orders_incremental"
    ) == [(150, 150)]
    assert mart_totals(state_dir) == expected_revenue(first + second)


def test_failing_dbt_test_fails_its_asset_check(
    ingest: Ingest, create_topic: CreateTopic, ledger_producer: LedgerProducer
) -> None:
    topic = create_topic(partitions=1)
    event = make_order_event(random.Random(3), 1, now=DAY) | {"status": "lost-in-transit"}
    ledger_producer.produce(topic, [(b"ord-1", encode_event(event), None)])
    ingest(demo_spec(topic))
    result = build_dbt()
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    status = next(name for name in checks if name.startswith("accepted_values_stg_orders_status"))
    assert not checks[status].passed
    assert checks[status].asset_key == AssetKey(["stg_orders"])
    assert checks["unique_stg_orders_order_id"].passed
