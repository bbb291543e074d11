"""The code location's resources come from the one configuration, read when the location
loads (``$PLATFORM_CONFIG``, else the embedded stack's defaults), never at import; a given
configuration wins."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from platform_assets.resources import build_resources
from resources.alerts import AlertResource
from resources.config import PlatformConfig
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource


def test_every_resource_an_asset_check_or_sensor_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLATFORM_CONFIG", raising=False)
    resources = build_resources()
    assert set(resources) == {"kafka", "iceberg", "spark", "alerts"}
    assert isinstance(resources["kafka"], KafkaResource)
    assert isinstance(resources["iceberg"], IcebergCatalogResource)
    assert isinstance(resources["spark"], SparkResource)
    assert isinstance(resources["alerts"], AlertResource)
    assert resources["iceberg"].source() == "embedded"


def test_the_configuration_file_is_read_at_each_build_not_at_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "platform.yaml"
    monkeypatch.setenv("PLATFORM_CONFIG", str(path))
    for servers in ("first:9092", "second:9092"):  # a reload reads the file again
        path.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": servers}}))
        assert build_resources()["kafka"].client_config()["bootstrap.servers"] == servers


def test_a_given_configuration_wins_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLATFORM_CONFIG", str(tmp_path / "missing.yaml"))  # not read
    config = PlatformConfig.model_validate({"kafka": {"bootstrap_servers": "given:9092"}})
    kafka = build_resources(config)["kafka"]
    assert kafka.client_config() == {"bootstrap.servers": "given:9092"}
