"""confluent-kafka's in-memory Schema Registry client, isolated here.

It lives at a private path in confluent-kafka 2.16 (``mock://`` URLs are not auto-mocked), and
is per process: the engine resolves writer schemas on the driver and ships them to executors.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka.schema_registry._sync.mock_schema_registry_client import (
    MockSchemaRegistryClient,
)


def make_registry() -> Any:
    """A fresh in-memory registry client."""
    return MockSchemaRegistryClient({"url": "mock://tests"})
