"""The platform's one configuration: Kafka, Schema Registry, Iceberg catalog, FileIO, Spark, alerts.

The code location, its sensors, the ``platform`` CLI and the dbt plugin all read it through
:func:`load_config`: a YAML file named by ``$PLATFORM_CONFIG``, or, without it, the defaults
below, which are the embedded stack of ``make dev`` and the tests. Deploying means writing that
file, never editing code. Secrets stay ``${NAME}`` references (``resources.secrets``), resolved
only when a client is built; a literal value for a credential key is refused. An example::

    kafka:
      bootstrap_servers: b-1.kafka.internal:9096
      properties: {security.protocol: SASL_SSL, sasl.mechanism: SCRAM-SHA-512,
                   sasl.username: ingest, sasl.password: "${KAFKA_SASL_PASSWORD}"}
    catalog:
      name: prod
      properties: {type: rest, uri: "https://catalog.internal", credential: "${ICEBERG_CREDENTIAL}"}
    file_io: {s3.region: eu-west-1}
    spark: {master: "spark://spark-master:7077", ship_engine: true}
    # or attach every run to a long-lived Spark Connect server:
    # spark: {remote: "sc://spark-connect.internal:15002", ship_engine: true}
    replicas:
      dr: {bootstrap_servers: b-1.kafka-dr.internal:9096,
           properties: {sasl.password: "${KAFKA_DR_SASL_PASSWORD}"}}
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from resources.secrets import REFERENCE_FORMS, is_secret_key, keeps_secret_out

CONFIG_ENV = "PLATFORM_CONFIG"
# A password written into a URI (``scheme://user:password@host``) instead of a reference.
LITERAL_URI_PASSWORD = re.compile(r"://[^/:@]+:(?!\$\{)[^@/]+@")


def _stringify(value: Any) -> Any:
    """YAML scalars as librdkafka/pyiceberg/Spark expect them: ``true``, ``30000``."""
    if not isinstance(value, dict):
        return value
    return {k: str(v).lower() if isinstance(v, bool) else v for k, v in value.items()}


# String-valued properties; YAML booleans and numbers are accepted and passed on as text.
Properties = Annotated[dict[str, str], BeforeValidator(_stringify)]


class ConfigError(ValueError):
    """The configuration is invalid; the message names the file, the key path and the fix."""


def _no_literal_secrets(properties: dict[str, str], section: str) -> dict[str, str]:
    for key, value in properties.items():
        literal = is_secret_key(key) and value and not keeps_secret_out(value)
        if literal or LITERAL_URI_PASSWORD.search(value):
            raise ValueError(
                f"{section}.{key} holds a literal secret; keep it out of the file: "
                + REFERENCE_FORMS
            )
    return properties


class Section(BaseModel):
    """A configuration section: unknown keys are refused (a misspelt key fails validation)."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class KafkaConfig(Section):
    """Any librdkafka property (SASL/SSL/OAUTHBEARER...); secrets as ``${NAME}``.

    ``properties`` feed every client; ``consumer_properties``, ``producer_properties`` and
    ``admin_properties`` one kind only and win over ``properties`` there (Kafka Connect's
    ``consumer.override.*`` and the like, ``ingestion.kafka.clients``).
    """

    bootstrap_servers: str = "${KAFKA_BOOTSTRAP_SERVERS}"
    properties: Properties = Field(default_factory=dict)
    consumer_properties: Properties = Field(default_factory=dict)
    producer_properties: Properties = Field(default_factory=dict)
    admin_properties: Properties = Field(default_factory=dict)

    @field_validator("properties", "consumer_properties")
    @classmethod
    def _secrets(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        from ingestion.kafka.consumer import ENGINE_OWNED_PROPERTIES

        owned = sorted(ENGINE_OWNED_PROPERTIES & value.keys())
        if owned:
            raise ValueError(
                f"sets {owned}: the ingestion engine sets these for exactly-once reads; remove them"
            )
        return _no_literal_secrets(value, str(info.field_name))

    @field_validator("producer_properties", "admin_properties")
    @classmethod
    def _client_secrets(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        return _no_literal_secrets(value, str(info.field_name))

    def client_maps(self) -> dict[str, str]:
        """``properties`` with each client's overrides under its Kafka Connect prefix: the
        flat map the resource and the engine carry."""
        from ingestion.kafka.clients import with_overrides

        return with_overrides(
            self.properties,
            {
                "consumer": self.consumer_properties,
                "producer": self.producer_properties,
                "admin": self.admin_properties,
            },
        )


class ReplicaClusterConfig(KafkaConfig):
    """A MirrorMaker 2 replica cluster (``replicas.<name>``): its own bootstrap servers and
    librdkafka properties, secrets as ``${NAME}``; the Schema Registry stays the one above."""

    bootstrap_servers: str


class SchemaRegistryConfig(Section):
    """The Schema Registry: ``url`` (else each pipeline's ``schema_registry_url``) and client
    properties (``basic.auth.user.info``, ``ssl.ca.location``, ...)."""

    url: str = ""
    properties: Properties = Field(default_factory=dict)

    @field_validator("properties")
    @classmethod
    def _secrets(cls, value: dict[str, str]) -> dict[str, str]:
        return _no_literal_secrets(value, "properties")


class CatalogConfig(Section):
    """Any pyiceberg catalog. Empty ``properties``: pyiceberg's own configuration of ``name``
    (``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__*``) when it has one, else the embedded
    SQLite catalog under ``state_dir``."""

    name: str = "platform"
    properties: Properties = Field(default_factory=dict)
    state_dir: str = "${PLATFORM_STATE_DIR:-.platform}"

    @field_validator("properties")
    @classmethod
    def _secrets(cls, value: dict[str, str]) -> dict[str, str]:
        return _no_literal_secrets(value, "properties")


class SparkConfig(Section):
    """The Spark master, or ``remote``: the ``sc://host:port`` of a long-lived Spark Connect
    server every run attaches to (then ``master`` is the server's business); Spark properties
    (``conf``; runtime SQL settings only over Connect) and whether to ship the engine's zip."""

    master: str = "local[*]"
    remote: str = "${PLATFORM_SPARK_REMOTE:-}"  # make dev sets it to its Connect server
    app_name: str = "kafka-iceberg-platform"
    conf: Properties = Field(default_factory=dict)
    ship_engine: bool = False

    @field_validator("conf")
    @classmethod
    def _secrets(cls, value: dict[str, str]) -> dict[str, str]:
        return _no_literal_secrets(value, "conf")

    @field_validator("remote")
    @classmethod
    def _remote(cls, value: str) -> str:
        if value and not value.startswith(("sc://", "${")):
            raise ValueError(
                f"{value!r} is not a Spark Connect URL: write sc://host:port (the server's "
                "spark.connect.grpc.binding.port, 15002 by default), or leave it empty"
            )
        return value


class StreamingConfig(Section):
    """How the continuous pipelines share processes: ``workers`` long-lived stream runs serve
    every streaming pipeline of the code location, each pipeline in one of them (by a stable
    hash of its name, so adding one moves no other), each holding one run slot however many
    pipelines it serves (``platform_assets/streaming``)."""

    workers: int = Field(default=1, ge=1, le=64)


class AlertsConfig(Section):
    """Alert sinks: the log always; webhook and Slack when their reference resolves non-empty."""

    webhook_url: str = "${PLATFORM_ALERT_WEBHOOK_URL:-}"
    slack_token: str = "${PLATFORM_SLACK_TOKEN:-}"  # noqa: S105 - a reference, not a secret
    slack_channel: str = "#data-alerts"
    ui_base_url: str = "${PLATFORM_UI_BASE_URL:-}"
    reminder_hours: float = Field(default=6.0, ge=0)

    @field_validator("slack_token", "webhook_url")
    @classmethod
    def _secret(cls, value: str) -> str:
        if value and not keeps_secret_out(value):
            raise ValueError(f"a credential, not its value: {REFERENCE_FORMS}")
        return value


class PlatformConfig(Section):
    """The whole configuration. Every default is the embedded stack's.

    Example:
        >>> PlatformConfig().catalog.state_dir
        '${PLATFORM_STATE_DIR:-.platform}'
    """

    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    replicas: dict[str, ReplicaClusterConfig] = Field(
        default_factory=dict, description="Replica clusters by name (a pipeline's replicas)."
    )
    schema_registry: SchemaRegistryConfig = Field(default_factory=SchemaRegistryConfig)
    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    file_io: Properties = Field(
        default_factory=dict, description="pyiceberg FileIO properties (s3.*, gcs.*, adls.*)."
    )
    spark: SparkConfig = Field(default_factory=SparkConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    streaming: StreamingConfig = Field(default_factory=StreamingConfig)
    pipelines_file: str = Field(default="", description="Pipeline specs; '' = the packaged one.")

    @field_validator("file_io")
    @classmethod
    def _secrets(cls, value: dict[str, str]) -> dict[str, str]:
        return _no_literal_secrets(value, "file_io")

    @field_validator("replicas")
    @classmethod
    def _replica_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if name == "primary" or not re.fullmatch(r"[a-z][a-z0-9_-]*", name):
                raise ValueError(
                    f"replica name {name!r}: use lower-case letters, digits, '_' or '-' "
                    "('primary' is the kafka section)"
                )
        return value


def config_path() -> Path | None:
    """The file named by ``$PLATFORM_CONFIG`` (read now, never at import), or None."""
    value = os.environ.get(CONFIG_ENV, "")
    return Path(value) if value else None


def describe_errors(error: ValidationError, source: str) -> str:
    """Each validation error as ``source: key.path: what is wrong``, one a line.

    Example:
        >>> try:
        ...     PlatformConfig.model_validate({"schema_registry": {"uri": "x"}})
        ... except ValidationError as exc:
        ...     print(describe_errors(exc, "p.yaml"))
        p.yaml: schema_registry.uri: Extra inputs are not permitted (known: url, properties)
    """
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message += f" (known: {', '.join(_known_keys(item['loc'][:-1]))})"
        lines.append(f"{source}: {path}: {message}")
    return "\n".join(lines)


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    from typing import get_args

    model: Any = PlatformConfig
    for part in loc:
        fields = getattr(model, "model_fields", None)
        model = fields[part].annotation if fields else get_args(model)[-1]  # a dict's value
    return list(model.model_fields)


def load_config(path: Path | None = None) -> PlatformConfig:
    """Load and validate the configuration: ``path``, else ``$PLATFORM_CONFIG``, else defaults.

    Raises:
        ConfigError: the file is missing, not YAML, or a key is wrong (its path is named).
    """
    import yaml

    path = path or config_path()
    if path is None:
        return PlatformConfig()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"{CONFIG_ENV}={path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections") from None
    try:
        return PlatformConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc, str(path))) from None
