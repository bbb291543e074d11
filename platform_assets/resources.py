"""Resource wiring for the code location: the embedded stack by default, settings from env."""

from typing import Any

from dagster import EnvVar

from resources.alerts import AlertResource
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource


def build_resources() -> dict[str, Any]:
    """Return the resources every asset, check and sensor uses.

    Values come from the environment when a run starts (``EnvVar``), never at import time:
    ``KAFKA_BOOTSTRAP_SERVERS``, ``PLATFORM_STATE_DIR``, ``PLATFORM_ALERT_WEBHOOK_URL``,
    ``PLATFORM_SLACK_TOKEN`` (these two may be empty: that sink is off) and
    ``PLATFORM_UI_BASE_URL`` (the UI address alerts link to; empty = no links); ``make dev``
    sets them. For a production deployment replace these with your cluster's settings and secrets,
    e.g. ``KafkaResource(bootstrap_servers=..., sasl_password=EnvVar("KAFKA_SASL_PASSWORD"))``.
    """
    return {
        "kafka": KafkaResource(bootstrap_servers=EnvVar("KAFKA_BOOTSTRAP_SERVERS")),
        "iceberg": IcebergCatalogResource(state_dir=EnvVar("PLATFORM_STATE_DIR")),
        "spark": SparkResource(master="local[*]"),
        "alerts": AlertResource(
            webhook_url=EnvVar("PLATFORM_ALERT_WEBHOOK_URL"),
            slack_token=EnvVar("PLATFORM_SLACK_TOKEN"),
            ui_base_url=EnvVar("PLATFORM_UI_BASE_URL"),
        ),
    }
