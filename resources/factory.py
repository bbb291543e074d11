"""The Dagster resources built from the one configuration (``resources.config``).

The code location (``platform_assets.resources``), the ``platform`` CLI and the dbt plugin all
call these, so a deployment is configured once. The resources hold ``${NAME}`` references,
never resolved secrets; they are resolved when a client is built.
"""

from __future__ import annotations

import os
from typing import Any

from resources.alerts import AlertResource
from resources.config import PlatformConfig
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.secrets import REFERENCE, references
from resources.spark import SparkResource


def kafka_resource(config: PlatformConfig) -> KafkaResource:
    """Kafka clients and the Schema Registry client, from ``kafka`` and ``schema_registry``.

    Example:
        >>> kafka_resource(PlatformConfig()).bootstrap_servers
        '${KAFKA_BOOTSTRAP_SERVERS}'
    """
    return KafkaResource(
        bootstrap_servers=config.kafka.bootstrap_servers,
        client_properties=config.kafka.client_maps(),
        schema_registry_url=config.schema_registry.url,
        schema_registry_properties=dict(config.schema_registry.properties),
        replicas={
            name: {"bootstrap.servers": replica.bootstrap_servers, **replica.client_maps()}
            for name, replica in config.replicas.items()
        },
    )


def iceberg_resource(config: PlatformConfig) -> IcebergCatalogResource:
    """The catalog from ``catalog`` and ``file_io``."""
    return IcebergCatalogResource(
        catalog_name=config.catalog.name,
        properties=dict(config.catalog.properties),
        file_io=dict(config.file_io),
        state_dir=config.catalog.state_dir,
    )


def spark_resource(config: PlatformConfig) -> SparkResource:
    """The Spark session from ``spark``."""
    return SparkResource(
        master=config.spark.master,
        app_name=config.spark.app_name,
        spark_config=dict(config.spark.conf),
        ship_engine=config.spark.ship_engine,
        remote=config.spark.remote,
    )


def alert_resource(config: PlatformConfig) -> AlertResource:
    """The alert sinks from ``alerts``."""
    alerts = config.alerts
    return AlertResource(
        webhook_url=alerts.webhook_url,
        slack_token=alerts.slack_token,
        slack_channel=alerts.slack_channel,
        ui_base_url=alerts.ui_base_url,
        reminder_hours=alerts.reminder_hours,
    )


def build_resources(config: PlatformConfig) -> dict[str, Any]:
    """Every resource the assets, checks and sensors use (dbt's is added by the location)."""
    return {
        "kafka": kafka_resource(config),
        "iceberg": iceberg_resource(config),
        "spark": spark_resource(config),
        "alerts": alert_resource(config),
    }


def unresolved(config: PlatformConfig, environ: dict[str, str]) -> list[str]:
    """``key: VARIABLE`` for every reference (without a default) whose variable is unset.

    Example:
        >>> unresolved(PlatformConfig(), {})
        ['kafka.bootstrap_servers: KAFKA_BOOTSTRAP_SERVERS']
    """
    missing = []
    for key, value in _flatten(config.model_dump()):
        missing += [f"{key}: {name}" for name in references(value) if name not in environ]
    return missing


def redact(text: str, config: PlatformConfig, environ: dict[str, str] | None = None) -> str:
    """``text`` with the value of every variable the configuration refers to masked (an error
    message of a client library may quote a URI or a property).

    Example:
        >>> config = PlatformConfig.model_validate({"file_io": {"s3.secret-access-key": "${K}"}})
        >>> redact("denied for key s3cr3t", config, {"K": "s3cr3t"})
        'denied for key ***'
    """
    env = os.environ if environ is None else environ
    for _, value in _flatten(config.model_dump()):
        for match in REFERENCE.finditer(value):
            secret = env.get(match.group(1), "")
            if len(secret) >= 4:
                text = text.replace(secret, "***")
    return text


def _flatten(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(data, dict):
        return [
            item
            for key, value in data.items()
            for item in _flatten(value, f"{prefix}.{key}" if prefix else str(key))
        ]
    return [(prefix, data)] if isinstance(data, str) else []
