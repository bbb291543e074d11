"""SSL settings pass through to every Kafka client the product creates.

A second Tansu broker sits behind a TLS-terminating proxy and advertises only the proxy: a
client without the SSL settings cannot even fetch metadata. An ingestion with a dead-letter
topic (planner, admin, Spark task readers, dead-letter producer, group mirror), the status
read (first-record timestamps) and every check (the audit re-reads Kafka) all go through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from platform_assets.cli.main import pipeline_status
from resources.embedded import EmbeddedBroker, find_free_port
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.brokers import BROKER_STOP_S
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, make_spec, records
from tests.support.tls_proxy import TlsProxy, make_self_signed_certificate

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaResource, TlsProxy]]:
    """A KafkaResource that reaches its broker only through TLS, and the proxy."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = make_self_signed_certificate(directory)
    proxy_port = find_free_port()
    with (
        EmbeddedBroker(
            log_path=directory / "tansu.log",
            advertised_port=proxy_port,
            stop_timeout_s=BROKER_STOP_S,
        ) as broker,
        TlsProxy(proxy_port, int(broker.port or 0), cert, key) as proxy,
    ):
        yield (
            KafkaResource(
                bootstrap_servers=f"127.0.0.1:{proxy_port}",
                client_properties={"security.protocol": "SSL", "ssl.ca.location": str(cert)},
            ),
            proxy,
        )


def test_plaintext_client_is_refused(tls_kafka: tuple[KafkaResource, TlsProxy]) -> None:
    """The control: without the SSL settings nothing gets through."""
    kafka, _ = tls_kafka
    plaintext = KafkaResource(bootstrap_servers=kafka.bootstrap_servers)
    admin = plaintext.get_admin_client()
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)


def test_ingestion_status_and_checks_over_tls(
    tls_kafka: tuple[KafkaResource, TlsProxy], harness: Harness, tmp_path: Path
) -> None:
    kafka, proxy = tls_kafka
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
    handshakes = proxy.handshakes

    report = tls_harness.run(spec)  # Spark executors read through TLS too

    assert (report.records, report.quarantined, report.dead_letter_copies) == (49, 1, 1)
    tls_harness.assert_exactly_once(spec, ledger)
    status = pipeline_status(spec, kafka, iceberg)  # checks, mirror, audit's Kafka recount
    assert status.failing == {}
    assert {p.partition: p.mirrored for p in status.partitions} == {
        p.partition: p.committed for p in status.partitions
    }
    consumer = kafka.get_consumer()
    assert consumer.get_watermark_offsets(TopicPartition("tls-dlq", 0), timeout=10) == (0, 1)
    consumer.close()
    assert proxy.handshakes > handshakes
