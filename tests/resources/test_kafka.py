"""TLS and SASL settings pass through to every Kafka client the product creates.

The session's secured broker (tests/support/tls.py) serves SASL_SSL with SCRAM-SHA-512 and a
certificate from a CA of the session's own, and each client here is given only that listener: a
client without the TLS settings, without the CA, or with a wrong password cannot even fetch
metadata. An ingestion with a dead-letter topic (planner, admin, Spark task readers, dead-letter
producer, group mirror), the status read (first-record timestamps) and every check (the audit
re-reads Kafka) all go through it.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from platform_assets.cli.main import pipeline_status
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, make_spec, records

if TYPE_CHECKING:  # cryptography is imported by the fixture that makes the CA, not here
    from tests.support.tls import SecureBroker

pytestmark = pytest.mark.integration
QUIET = {"logger": logging.getLogger("tests.refused_clients")}  # their retries, not on stderr


@pytest.mark.parametrize(
    ("drop", "change"),
    [
        pytest.param(("ssl.", "sasl."), {"security.protocol": "PLAINTEXT"}, id="plaintext"),
        pytest.param(("ssl.ca.location",), {}, id="ca-not-trusted"),
        pytest.param((), {"sasl.password": "not-the-password"}, id="wrong-password"),
    ],
)
def test_client_without_the_settings_is_refused(
    secure_broker: SecureBroker, drop: tuple[str, ...], change: dict[str, str]
) -> None:
    """The controls: each setting is needed; without it nothing gets through (without the CA,
    librdkafka trusts the system's CAs only, and ours is not among them)."""
    kafka = secure_broker.kafka()
    config = {k: v for k, v in kafka.client_config().items() if not k.startswith(drop)}
    admin = kafka.get_admin_client()  # the control: every setting given, it is served
    assert kafka.get_cluster_id() == admin.list_topics(timeout=10).cluster_id
    refused = KafkaResource(bootstrap_servers=kafka.bootstrap_servers)
    with pytest.raises(KafkaException):
        refused.get_admin_client(**{**config, **change, **QUIET}).list_topics(timeout=3)


def test_ingestion_status_and_checks_over_sasl_ssl(
    secure_broker: SecureBroker, harness: Harness, tmp_path: Path
) -> None:
    kafka = secure_broker.kafka()
    admin = kafka.get_admin_client()
    futures = admin.create_topics([NewTopic("tls-events", 2, 1), NewTopic("tls-dlq", 1, 1)])
    for future in futures.values():
        future.result(15)
    ledger = Ledger()
    bad = [(b"bad", b"not json", None)]
    LedgerProducer(kafka, ledger).produce("tls-events", records(40) + bad + records(9, first=40))
    spec = make_spec(
        "tls-events",
        "tls",
        errors_tolerance="all",
        dead_letter_topic="tls-dlq",
        max_dead_letter_ratio=0.5,
    )
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path))
    tls_harness = dataclasses.replace(
        harness, kafka=kafka, catalog=iceberg.load_catalog(), cluster_id=kafka.get_cluster_id()
    )

    report = tls_harness.run(spec)  # Spark executors read through TLS too

    assert (report.records, report.quarantined, report.dead_letter_copies) == (49, 1, 1)
    tls_harness.assert_exactly_once(spec, ledger)
    status = pipeline_status(spec, kafka, iceberg)  # checks, mirror, audit's Kafka recount
    assert status.failing == {}
    assert {p.partition: p.mirrored for p in status.partitions} == {
        p.partition: p.committed for p in status.partitions
    }
    consumer = kafka.get_consumer()  # read_committed: the letter once, in its transaction
    try:
        consumer.assign([TopicPartition("tls-dlq", 0, 0)])
        letters = [m.value() for m in consumer.consume(10, timeout=5) if m.error() is None]
    finally:
        consumer.close()
    assert letters == [b"not json"]
