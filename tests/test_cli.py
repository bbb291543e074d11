"""The operator CLI on the real stack, for the demo pipeline of pipelines.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ingestion.run import run_pipeline
from platform_assets.cli import main
from platform_assets.pipelines import load_pipelines
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import records

pytestmark = pytest.mark.integration


def test_status_validate_reset_and_maintain(
    kafka: KafkaResource, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], ledger_producer: LedgerProducer, demo_topic: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    monkeypatch.setenv("PLATFORM_STATE_DIR", str(tmp_path))
    ledger_producer.produce(demo_topic, records(12))
    (spec,) = load_pipelines()
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    run_pipeline(spec, kafka.client_config(), catalog, None, kafka.get_cluster_id())

    assert main(["status"]) == 0
    text = capsys.readouterr().out
    assert "orders  table=demo.orders  group=platform-orders" in text
    assert "lag: 0 records" in text
    assert main(["status", "--json"]) == 0
    (status,) = json.loads(capsys.readouterr().out)
    assert status["committed"] == status["end"] == status["mirrored"]
    assert main(["validate"]) == 0
    assert "1 pipeline(s) valid" in capsys.readouterr().out

    assert main(["reset", "orders", "--to", "earliest"]) == 0
    dry = capsys.readouterr().out
    assert "re-read" in dry
    assert "dry run: nothing committed" in dry
    assert main(["reset", "orders", "--to", "earliest", "--apply", "--reason", "test"]) == 0
    assert "committed in snapshot" in capsys.readouterr().out
    assert catalog.load_table("demo.orders").scan().to_arrow().num_rows == 0
    assert main(["maintain", "orders", "--retention-hours", "0"]) == 0
    assert "kept" in capsys.readouterr().out
