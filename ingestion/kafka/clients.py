"""Per-client Kafka properties: one shared map, and overrides per kind of client.

The configuration's ``kafka.properties`` feed every client; ``kafka.consumer_properties``,
``kafka.producer_properties`` and ``kafka.admin_properties`` apply to one kind only (as Kafka
Connect's ``consumer.override.*``, ``producer.override.*`` and ``admin.override.*``). A
consumer-only setting such as ``fetch.max.bytes`` then no longer reaches the producers and
admin clients, where librdkafka warns that it ignores it.

The engine receives one flat map (it is pickled into executor tasks): the overrides travel in
it under their Kafka Connect prefixes, and :func:`client_properties` gives each client its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

Client = Literal["consumer", "producer", "admin"]
CLIENTS: tuple[Client, ...] = ("consumer", "producer", "admin")


def override_prefix(client: Client) -> str:
    """The flat map's prefix of ``client``'s overrides, Kafka Connect's spelling."""
    return f"{client}.override."


def with_overrides(
    shared: Mapping[str, Any], overrides: Mapping[Client, Mapping[str, Any]]
) -> dict[str, Any]:
    """One flat map: ``shared`` and each client's ``overrides`` under its prefix.

    Example:
        >>> with_overrides({"bootstrap.servers": "b:9092"}, {"consumer": {"fetch.max.bytes": 1}})
        {'bootstrap.servers': 'b:9092', 'consumer.override.fetch.max.bytes': 1}
    """
    flat = dict(shared)
    for client, properties in overrides.items():
        flat.update({override_prefix(client) + key: value for key, value in properties.items()})
    return flat


def client_properties(kafka_config: Mapping[str, Any], client: Client) -> dict[str, Any]:
    """The properties of one ``client`` from the flat map: the shared ones, then its own
    overrides (which win); other clients' overrides are left out.

    Example:
        >>> flat = {"bootstrap.servers": "b:9092", "acks": "1",
        ...         "consumer.override.fetch.max.bytes": 1, "producer.override.acks": "all"}
        >>> client_properties(flat, "producer")
        {'bootstrap.servers': 'b:9092', 'acks': 'all'}
        >>> client_properties(flat, "consumer")
        {'bootstrap.servers': 'b:9092', 'acks': '1', 'fetch.max.bytes': 1}
    """
    prefixes = tuple(override_prefix(c) for c in CLIENTS)
    shared = {k: v for k, v in kafka_config.items() if not k.startswith(prefixes)}
    own = override_prefix(client)
    mine = {k.removeprefix(own): v for k, v in kafka_config.items() if k.startswith(own)}
    return {**shared, **mine}
