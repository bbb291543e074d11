"""A certificate authority of the test session's own, a broker certificate it signs, and the
secured broker that serves it.

Made with the ``cryptography`` package in memory (no ``openssl`` or ``keytool`` run): the CA's
certificate as PEM (what a client's ``ssl.ca.location`` names) and the server's certificate for
``127.0.0.1`` and ``localhost`` with its key in a password-protected PKCS#12 keystore (what
Kafka's ``ssl.keystore.location`` names). Nothing is trusted but this CA, so a client that does
not name it fails verification, as against a private CA in production.

:func:`secured_broker` starts an embedded Kafka broker whose second listener speaks SASL_SSL
(SCRAM-SHA-512, one user with a random password) with that certificate: the one secured broker
of a test session (``secure_broker`` in ``tests/conftest.py``).
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from resources.embedded import EmbeddedBroker, SaslSslListener
from resources.kafka import KafkaResource

VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Keystore:
    """A PKCS#12 keystore holding one key and its certificate chain."""

    path: Path
    password: str


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA: its certificate (PEM at ``cert_path``) and its key, to sign server certificates."""

    cert_path: Path
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def server_keystore(
        self,
        directory: Path,
        name: str = "broker",
        hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
    ) -> Keystore:
        """A server certificate for ``hosts`` (IPs and DNS names), signed by this CA, and its
        key in ``directory/<name>.p12`` under a fresh random password."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        password = secrets.token_hex(12)
        path = directory / f"{name}.p12"
        path.write_bytes(
            pkcs12.serialize_key_and_certificates(
                name.encode(),
                key,
                certificate,
                [self.certificate],
                serialization.BestAvailableEncryption(password.encode()),
            )
        )
        path.chmod(0o600)
        return Keystore(path, password)


def make_ca(directory: Path, name: str = "platform-test-ca") -> CertificateAuthority:
    """A self-signed CA valid for two days; its certificate written to ``directory/ca.pem``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / "ca.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return CertificateAuthority(cert_path, certificate, key)


@dataclass(frozen=True)
class SecureBroker:
    """A running broker with a SASL_SSL listener, the CA that signed it and its SCRAM user."""

    broker: EmbeddedBroker
    ca_path: Path
    user: str
    password: str

    @property
    def bootstrap_servers(self) -> str:
        """The SASL_SSL listener (the only one a client here is given)."""
        return self.broker.sasl_ssl_bootstrap_servers

    def client_properties(self) -> dict[str, str]:
        """librdkafka's TLS and SASL settings for this broker, without the credentials."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "ssl.ca.location": str(self.ca_path),
        }

    def kafka(self) -> KafkaResource:
        """A KafkaResource with every setting and the user's credentials (for test clients)."""
        return KafkaResource(
            bootstrap_servers=self.bootstrap_servers,
            client_properties=self.client_properties(),
            sasl_username=self.user,
            sasl_password=self.password,
        )


@contextmanager
def secured_broker(
    directory: Path, user: str = "platform-ingest", stop_timeout_s: float = 5.0
) -> Iterator[SecureBroker]:
    """A CA, a broker certificate for 127.0.0.1/localhost, and a broker serving SASL_SSL with
    SCRAM-SHA-512 user ``user`` (a random password), stopped on exit."""
    ca = make_ca(directory)
    keystore = ca.server_keystore(directory)
    password = f"scram-{secrets.token_hex(12)}"
    listener = SaslSslListener(keystore.path, keystore.password, {user: password})
    with EmbeddedBroker(
        log_path=directory / "kafka.log",
        name="secured_cluster",
        sasl_ssl=listener,
        stop_timeout_s=stop_timeout_s,
    ) as broker:
        secure = SecureBroker(broker, ca.cert_path, user, password)
        load_group_coordinator(secure.kafka())
        yield secure


def load_group_coordinator(kafka: KafkaResource, timeout_s: float = 60.0) -> None:
    """Create and load ``__consumer_offsets`` before any admin client asks for a group's offsets.

    On a fresh broker the first OffsetFetch may be answered NOT_COORDINATOR while the offsets
    topic is created and loaded; an *admin* client's ListConsumerGroupOffsets then crashes
    librdkafka 2.16 (SIGSEGV in ``rd_kafka_cgrp_op`` on the admin client's NULL group handle,
    confluentinc/librdkafka#5040, seen here in the platform's group mirror). A consumer's
    committed() creates the topic; it may itself be answered NOT_COORDINATOR (a broker that
    started sooner than the topic loads), so it is asked again until the coordinator answers.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    deadline = time.monotonic() + timeout_s
    consumer = Consumer({**kafka.client_config(), "group.id": "platform-test-warmup"})
    try:
        while True:
            try:
                consumer.committed([TopicPartition("platform-test-warmup", 0)], timeout=10)
                return
            except KafkaException as exc:
                retriable = exc.args[0].name() in NOT_READY
                if not retriable or time.monotonic() >= deadline:
                    raise
            time.sleep(0.5)
    finally:
        consumer.close()


NOT_READY = {
    "NOT_COORDINATOR",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "COORDINATOR_NOT_AVAILABLE",
    "_TIMED_OUT",
}
