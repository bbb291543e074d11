"""Per-client Kafka properties: the shared map plus one kind's overrides reach that
kind of client only, so librdkafka has nothing to ignore. Real librdkafka clients, no broker
(a property librdkafka ignores is reported when the client is created)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from ingestion.kafka.clients import client_properties, with_overrides
from ingestion.kafka.consumer import consumer_config

FLAT = with_overrides(
    {"bootstrap.servers": "127.0.0.1:1", "client.id": "shared"},
    {
        "consumer": {"fetch.max.bytes": "1048576", "client.id": "reader"},
        "producer": {"linger.ms": "7", "compression.type": "zstd"},
        "admin": {"socket.timeout.ms": "5000"},
    },
)


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _logger(name: str) -> tuple[logging.Logger, _Said]:
    said = _Said()
    logger = logging.getLogger(f"test.librdkafka.{name}")
    logger.propagate = False
    logger.addHandler(said)
    return logger, said


def test_each_client_gets_the_shared_map_and_only_its_own_overrides() -> None:
    assert client_properties(FLAT, "consumer") == {
        "bootstrap.servers": "127.0.0.1:1",
        "client.id": "reader",
        "fetch.max.bytes": "1048576",
    }
    assert client_properties(FLAT, "admin") == {
        "bootstrap.servers": "127.0.0.1:1",
        "client.id": "shared",
        "socket.timeout.ms": "5000",
    }
    assert consumer_config(FLAT, "r")["fetch.max.bytes"] == "1048576"


@pytest.mark.parametrize("kind", ["consumer", "producer", "admin"])
def test_librdkafka_ignores_nothing(kind: str) -> None:
    """Before, one map fed every client: a consumer setting made producers and admin clients
    warn ("... is a consumer property and will be ignored by this producer instance")."""
    logger, said = _logger(kind)
    routed: dict[str, Any] = {"logger": logger}
    if kind == "consumer":
        consumer = Consumer({**consumer_config(FLAT, "r"), **routed})
        consumer.poll(0.1)
        consumer.close()
    elif kind == "producer":
        Producer({**client_properties(FLAT, "producer"), **routed}).poll(0.1)
    else:
        AdminClient({**client_properties(FLAT, "admin"), **routed}).poll(0.1)
    assert not [line for line in said.lines if "will be ignored" in line], said.lines


def test_the_old_shared_map_did_make_librdkafka_ignore_a_property() -> None:
    """The test above can fail: a consumer property given to a producer is reported."""
    logger, said = _logger("shared")
    shared: dict[str, Any] = {"bootstrap.servers": "127.0.0.1:1", "fetch.max.bytes": "1048576"}
    Producer({**shared, "logger": logger}).poll(0.1)
    assert any("will be ignored" in line for line in said.lines), said.lines
