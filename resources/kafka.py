"""Kafka client factories for confluent-kafka, configured once for the whole platform."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource
from pydantic import ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

# Properties the engine owns: a user-supplied value would break exactly-once reads (see
# docs/reliability.md, rule 3), so they are rejected instead of silently overridden.
ENGINE_OWNED_PROPERTIES = frozenset(
    {"enable.auto.commit", "auto.offset.reset", "isolation.level", "group.id"}
)


class KafkaResource(ConfigurableResource):
    """Connection settings for one Kafka cluster and factories for its clients.

    Secrets (SASL password, SSL key password) are separate fields so they can be given as
    ``dagster.EnvVar``; they never appear in ``repr``, logs or asset metadata.

    Example:
        >>> kafka = KafkaResource(
        ...     bootstrap_servers="broker-1:9092,broker-2:9092",
        ...     client_properties={"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"},
        ...     sasl_username="ingest",
        ...     sasl_password="not-a-real-secret",
        ... )
        >>> kafka.client_config()["sasl.username"]
        'ingest'
    """

    model_config = ConfigDict(extra="forbid")  # a misspelt setting fails at load

    bootstrap_servers: str = Field(description="Comma-separated host:port list of the brokers.")
    client_properties: dict[str, str] = Field(
        default_factory=dict,
        description="librdkafka properties passed through to every client (SSL, SASL, timeouts).",
    )
    sasl_username: str | None = Field(default=None, description="SASL user (sasl.username).")
    sasl_password: str | None = Field(
        default=None, description="SASL password (sasl.password); give it as an EnvVar."
    )
    ssl_key_password: str | None = Field(
        default=None, description="Password of the SSL client key; give it as an EnvVar."
    )

    @field_validator("client_properties")
    @classmethod
    def _refuse_engine_owned(cls, properties: dict[str, str]) -> dict[str, str]:
        """Refused when the resource is built, so ``dagster definitions validate`` fails."""
        owned = sorted(ENGINE_OWNED_PROPERTIES & properties.keys())
        if owned:
            raise ValueError(
                f"KafkaResource.client_properties sets {owned}: these are set by the ingestion "
                "engine for exactly-once reads; remove them from client_properties."
            )
        return properties

    def client_config(self) -> dict[str, str]:
        """Return the librdkafka configuration shared by every client, secrets included."""
        config = {"bootstrap.servers": self.bootstrap_servers, **self.client_properties}
        secrets = {
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.key.password": self.ssl_key_password,
        }
        config.update({key: value for key, value in secrets.items() if value})
        return config

    def get_admin_client(self, **overrides: Any) -> AdminClient:
        """Return a new admin client."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({**self.client_config(), **overrides})

    def get_producer(self, **overrides: Any) -> Producer:
        """Return a new idempotent producer (acks=all, enable.idempotence=true by default)."""
        from confluent_kafka import Producer

        defaults = {"enable.idempotence": True, "acks": "all"}
        return Producer({**defaults, **self.client_config(), **overrides})

    def get_consumer(self, **overrides: Any) -> Consumer:
        """Return a consumer for ``assign()`` reads: no group membership, no auto commit.

        ``isolation.level=read_committed`` and ``auto.offset.reset=error`` are the defaults, so
        a read never sees aborted records and never jumps silently to another offset.
        """
        from confluent_kafka import Consumer

        defaults = {
            "group.id": "kafka-iceberg-platform-reader",  # required by librdkafka; never joined
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "isolation.level": "read_committed",
        }
        return Consumer({**defaults, **self.client_config(), **overrides})

    def get_cluster_id(self, timeout_s: float = 10.0) -> str:
        """Return the Kafka cluster id, stored next to the offsets to detect a swapped cluster."""
        metadata = self.get_admin_client().list_topics(timeout=timeout_s)
        return str(metadata.cluster_id)
