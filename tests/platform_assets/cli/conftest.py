"""The CLI's environment on the real stack: the demo pipeline of pipelines.yaml on the session
broker, a catalog of the test's own, and no Dagster instance unless a test makes one."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog

from ingestion.pipeline.run import RunReport, run_pipeline
from platform_assets.demo import encode_event, make_order_event
from platform_assets.pipelines import load_pipelines
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.ledger import LedgerProducer, Record


def orders(first: int, count: int) -> list[Record]:
    """Valid demo order events."""
    events = [make_order_event(random.Random(first), i) for i in range(first, first + count)]
    return [(e["order_id"].encode(), encode_event(e), None) for e in events]


@dataclass
class Demo:
    """The demo pipeline's catalog (of its own) and ``ingest()``, one run of the pipeline."""

    catalog: Catalog
    ingest: Callable[[], RunReport]


@pytest.fixture
def demo(
    kafka: KafkaResource,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ledger_producer: LedgerProducer,
    demo_topic: str,
) -> Demo:
    """The CLI's environment set (no ``DAGSTER_HOME``: the instance, if any, is the embedded
    stack's under ``tmp_path``), 12 orders produced and ingested once."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    monkeypatch.setenv("PLATFORM_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    (spec,) = load_pipelines()
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()

    def ingest() -> RunReport:
        return run_pipeline(spec, kafka.client_config(), catalog, None, kafka.get_cluster_id())

    ledger_producer.produce(demo_topic, orders(0, 12))
    ingest()
    return Demo(catalog, ingest)
