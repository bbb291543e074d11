"""Kafka client factories for confluent-kafka, configured once for the whole platform."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource
from pydantic import ConfigDict, Field, field_validator

from ingestion.kafka.clients import client_properties
from ingestion.kafka.consumer import ENGINE_OWNED_PROPERTIES, consumer_config
from resources.secrets import resolve, resolve_all

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient


class KafkaResource(ConfigurableResource):
    """Connection settings for one Kafka cluster and factories for its clients.

    Secrets are ``${NAME}`` references in ``client_properties`` (resolved from the environment
    only in :meth:`client_config`, when a client is built) or the separate fields below given as
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
    schema_registry_url: str = Field(
        default="", description="Schema Registry URL; '' = each pipeline's schema_registry_url."
    )
    schema_registry_properties: dict[str, str] = Field(
        default_factory=dict,
        description="Schema Registry client properties (basic.auth.user.info, ssl.ca.location).",
    )

    replicas: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="Replica clusters by name: each one's librdkafka properties, "
        "bootstrap.servers included, secrets as ${NAME} (the config's replicas section).",
    )

    def for_cluster(self, name: str) -> KafkaResource:
        """This resource for cluster ``name``: ``primary`` (itself) or a configured replica,
        with the same Schema Registry settings.

        Example:
            >>> kafka = KafkaResource(bootstrap_servers="a:9092",
            ...     replicas={"dr": {"bootstrap.servers": "b:9092"}})
            >>> kafka.for_cluster("dr").client_config()
            {'bootstrap.servers': 'b:9092'}
        """
        if name == "primary":
            return self
        if name not in self.replicas:
            raise ValueError(
                f"no replica cluster {name!r} in the configuration (replicas: "
                f"{sorted(self.replicas)}): add it under replicas.{name}"
            )
        properties = dict(self.replicas[name])
        return KafkaResource(
            bootstrap_servers=properties.pop("bootstrap.servers", ""),
            client_properties=properties,
            schema_registry_url=self.schema_registry_url,
            schema_registry_properties=self.schema_registry_properties,
        )

    @field_validator("client_properties")
    @classmethod
    def _refuse_engine_owned(cls, properties: dict[str, str]) -> dict[str, str]:
        """Refused when the resource is built, so ``dagster definitions validate`` fails."""
        owned = sorted(ENGINE_OWNED_PROPERTIES & client_properties(properties, "consumer").keys())
        if owned:
            raise ValueError(
                f"KafkaResource.client_properties sets {owned}: these are set by the ingestion "
                "engine for exactly-once reads; remove them from client_properties."
            )
        return properties

    def client_config(self) -> dict[str, str]:
        """Return the librdkafka configuration shared by every client, secrets included
        (``${NAME}`` references resolved now; never log the result)."""
        config = {
            "bootstrap.servers": resolve(self.bootstrap_servers, "kafka.bootstrap_servers"),
            **resolve_all(self.client_properties, "kafka.properties"),
        }
        secrets = {
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.key.password": self.ssl_key_password,
        }
        config.update({key: value for key, value in secrets.items() if value})
        return config

    def schema_registry_config(self, pipeline_url: str | None = None) -> dict[str, str]:
        """The Schema Registry client configuration, secrets resolved: the configured URL, else
        the pipeline's, with the configured properties (auth, TLS).

        Example:
            >>> KafkaResource(
            ...     bootstrap_servers="b:9092",
            ...     schema_registry_properties={"basic.auth.user.info": "${SR_AUTH:-u:p}"},
            ... ).schema_registry_config("http://registry:8081")
            {'url': 'http://registry:8081', 'basic.auth.user.info': 'u:p'}
        """
        url = resolve(self.schema_registry_url, "schema_registry.url") or pipeline_url or ""
        if not url:
            raise ValueError("no Schema Registry URL: set schema_registry.url in the config")
        return {
            "url": url,
            **resolve_all(self.schema_registry_properties, "schema_registry.properties"),
        }

    def get_schema_registry_client(self, pipeline_url: str | None = None) -> Any:
        """A ``SchemaRegistryClient`` for :meth:`schema_registry_config`."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        return SchemaRegistryClient(self.schema_registry_config(pipeline_url))

    def get_admin_client(self, **overrides: Any) -> AdminClient:
        """Return a new admin client."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({**client_properties(self.client_config(), "admin"), **overrides})

    def get_producer(self, **overrides: Any) -> Producer:
        """Return a new idempotent producer (acks=all, enable.idempotence=true by default)."""
        from confluent_kafka import Producer

        defaults = {"enable.idempotence": True, "acks": "all"}
        return Producer(
            {**defaults, **client_properties(self.client_config(), "producer"), **overrides}
        )

    def get_consumer(self, **overrides: Any) -> Consumer:
        """Return a consumer for ``assign()`` reads with the engine's settings
        (:func:`ingestion.kafka.consumer.consumer_config`: no group membership, no commit,
        ``read_committed``, ``auto.offset.reset=error``); ``overrides`` win (tests only)."""
        from confluent_kafka import Consumer

        return Consumer({**consumer_config(self.client_config(), "platform-reader"), **overrides})

    def get_cluster_id(self, timeout_s: float = 10.0) -> str:
        """Return the Kafka cluster id, stored next to the offsets to detect a swapped cluster."""
        metadata = self.get_admin_client().list_topics(timeout=timeout_s)
        return str(metadata.cluster_id)
