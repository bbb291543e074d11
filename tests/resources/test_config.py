"""The one configuration (PLATFORM_CONFIG): validation names the wrong key, secrets stay
references until a client is built, pyiceberg's own configuration is honoured, and the CLI
refuses a bad configuration before connecting to anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from platform_assets.cli.main import main
from platform_assets.resources import build_resources
from resources.config import ConfigError, PlatformConfig, load_config
from resources.factory import iceberg_resource, kafka_resource, spark_resource, unresolved
from resources.secrets import UnresolvedReferenceError, resolve


@pytest.mark.parametrize(
    ("value", "environ", "expected"),
    [
        ("plain", {}, "plain"),
        ("${A}", {"A": "x"}, "x"),
        ("${A:-d}", {}, "d"),
        ("${A:-}", {}, ""),
        ("${A:-d}", {"A": ""}, ""),  # set but empty wins over the default
        ("u:${P}@h:${PORT:-5432}", {"P": "pw"}, "u:pw@h:5432"),
        ("$A {A} $${A}", {"A": "x"}, "$A {A} $x"),  # only ${NAME} is a reference
    ],
)
def test_resolve(value: str, environ: dict[str, str], expected: str) -> None:
    assert resolve(value, "k", environ) == expected


def test_unset_reference_names_the_key_and_the_variable() -> None:
    with pytest.raises(UnresolvedReferenceError, match=r"'kafka\.properties\.sasl\.password'.*KP"):
        resolve("${KP}", "kafka.properties.sasl.password", {})


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "platform.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kafka": {"bootstrap": "b:9092"}}, r"kafka\.bootstrap: Extra inputs.*bootstrap_servers"),
        ({"catalogue": {}}, r": catalogue: Extra inputs"),
        (
            {"kafka": {"properties": {"sasl.password": "hunter2"}}},
            r"kafka\.properties: .*properties\.sasl\.password holds a literal secret",
        ),
        (
            {"catalog": {"properties": {"uri": "postgresql://u:hunter2@db/iceberg"}}},
            r"catalog\.properties: .*properties\.uri holds a literal secret",
        ),
        ({"file_io": {"s3.secret-access-key": "abc"}}, r"file_io: .*literal secret"),
        (
            {"catalog": {"properties": {"credential": "${ID:-me}:${SECRET:-hunter2}"}}},
            r"properties\.credential holds a literal secret.*\$\{CLIENT_ID\}:\$\{CLIENT_SECRET\}",
        ),
        ({"alerts": {"slack_token": "xoxb-1"}}, r"alerts\.slack_token: a credential"),
        ({"kafka": {"properties": {"group.id": "g"}}}, r"kafka\.properties: sets \['group\.id'\]"),
        ({"spark": {"ship_engine": "maybe"}}, r"spark\.ship_engine: Input should be a valid bool"),
        (
            {"spark": {"remote": "http://spark:15002"}},
            r"spark\.remote: 'http://spark:15002' is not a Spark Connect URL: write sc://host:port",
        ),
        ("[1, 2]", "the top level must be a mapping"),
        ("kafka: [", "not valid YAML"),
    ],
)
def test_invalid_configuration_names_the_key(tmp_path: Path, data: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, data))


def test_spark_remote_attaches_runs_to_a_connect_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spark.remote`` reaches the Spark resource; by default it is ``$PLATFORM_SPARK_REMOTE``
    (set by ``make dev``), empty when unset: each run starts its own session."""
    written = load_config(write(tmp_path, {"spark": {"remote": "sc://spark-connect:15002"}}))
    assert spark_resource(written).remote == "sc://spark-connect:15002"
    default = spark_resource(PlatformConfig())
    assert default.remote == "${PLATFORM_SPARK_REMOTE:-}"
    monkeypatch.delenv("PLATFORM_SPARK_REMOTE", raising=False)
    assert resolve(default.remote) == ""
    monkeypatch.setenv("PLATFORM_SPARK_REMOTE", "sc://127.0.0.1:15002")
    assert resolve(default.remote) == "sc://127.0.0.1:15002"


def test_yaml_scalars_become_property_text(tmp_path: Path) -> None:
    properties = {"enable.ssl.certificate.verification": False, "socket.timeout.ms": 30000}
    config = load_config(write(tmp_path, {"kafka": {"properties": properties}}))
    assert config.kafka.properties == {
        "enable.ssl.certificate.verification": "false",
        "socket.timeout.ms": "30000",
    }


def test_secrets_stay_references_until_a_client_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = {
        "kafka": {
            "bootstrap_servers": "b-1:9096",
            "properties": {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "OAUTHBEARER",
                "sasl.oauthbearer.client.secret": "${OAUTH_SECRET}",
            },
        },
        "schema_registry": {
            "url": "https://registry:8081",
            "properties": {"basic.auth.user.info": "${SR_AUTH}", "ssl.ca.location": "/ca.pem"},
        },
    }
    monkeypatch.setenv("PLATFORM_CONFIG", str(write(tmp_path, data)))
    monkeypatch.setenv("OAUTH_SECRET", "s3cr3t-oauth")
    monkeypatch.setenv("SR_AUTH", "user:s3cr3t-sr")
    kafka = build_resources()["kafka"]
    assert "s3cr3t" not in repr(kafka) + str(kafka.model_dump())
    assert kafka.client_config()["sasl.oauthbearer.client.secret"] == "s3cr3t-oauth"
    assert kafka.schema_registry_config("http://spec-url") == {
        "url": "https://registry:8081",
        "basic.auth.user.info": "user:s3cr3t-sr",
        "ssl.ca.location": "/ca.pem",
    }


def test_embedded_defaults_and_pyiceberg_own_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without PLATFORM_CONFIG the catalog is the embedded one under PLATFORM_STATE_DIR; with
    pyiceberg's own configuration of the catalog's name, that one is loaded instead."""
    monkeypatch.delenv("PLATFORM_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.pyiceberg.yaml
    monkeypatch.setenv("PLATFORM_STATE_DIR", str(tmp_path / "state"))
    config = load_config()
    assert config == PlatformConfig()
    assert unresolved(config, {}) == ["kafka.bootstrap_servers: KAFKA_BOOTSTRAP_SERVERS"]
    iceberg = iceberg_resource(config)
    assert iceberg.source() == "embedded"
    assert iceberg.catalog_properties()["uri"] == f"sqlite:///{tmp_path / 'state' / 'catalog.db'}"

    own = tmp_path / "own"
    monkeypatch.setenv("PYICEBERG_CATALOG__PLATFORM__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__PLATFORM__URI", f"sqlite:///{tmp_path / 'own.db'}")
    monkeypatch.setenv("PYICEBERG_CATALOG__PLATFORM__WAREHOUSE", own.as_uri())
    monkeypatch.setenv("PYICEBERG_CATALOG__PLATFORM__S3__REGION", "eu-west-1")
    iceberg = iceberg_resource(load_config())
    assert iceberg.source() == "pyiceberg"
    catalog = iceberg.load_catalog()
    assert catalog.properties["uri"] == f"sqlite:///{tmp_path / 'own.db'}"
    catalog.create_namespace("n")
    assert (tmp_path / "own.db").exists()
    assert not (tmp_path / "state").exists()
    assert iceberg.io_properties() == {"s3.region": "eu-west-1"}  # no URI, no credential


def test_io_properties_are_file_io_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CATALOG_CREDENTIAL", "id:secret")
    config = PlatformConfig.model_validate(
        {
            "catalog": {
                "properties": {
                    "type": "rest",
                    "uri": "https://catalog",
                    "credential": "${CATALOG_CREDENTIAL}",
                    "s3.region": "eu-west-1",
                }
            },
            "file_io": {"s3.endpoint": "https://s3.internal"},
        }
    )
    iceberg = iceberg_resource(config)
    assert iceberg.catalog_properties()["credential"] == "id:secret"
    assert iceberg.io_properties() == {
        "s3.region": "eu-west-1",
        "s3.endpoint": "https://s3.internal",
    }


def test_cli_refuses_a_bad_configuration_before_connecting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLATFORM_CONFIG", str(write(tmp_path, {"kafka": {"bootstrap": "x"}})))
    with pytest.raises(SystemExit, match=r"invalid configuration:\n.*kafka\.bootstrap: Extra"):
        main(["validate"])
    data = {"kafka": {"properties": {"sasl.password": "${KAFKA_PASSWORD_UNSET}"}}}
    monkeypatch.setenv("PLATFORM_CONFIG", str(write(tmp_path, data)))
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.delenv("KAFKA_PASSWORD_UNSET", raising=False)
    with pytest.raises(
        SystemExit, match=r"kafka\.properties\.sasl\.password: KAFKA_PASSWORD_UNSET"
    ):
        main(["status"])
    monkeypatch.setenv("PLATFORM_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(SystemExit, match=r"PLATFORM_CONFIG=.*missing\.yaml: cannot read it"):
        main(["validate"])


def test_kafka_resource_from_defaults_reads_the_environment_at_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kafka = kafka_resource(PlatformConfig())
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "late:9092")
    assert kafka.client_config() == {"bootstrap.servers": "late:9092"}


def test_a_credential_may_hold_references_anywhere_inside_it(tmp_path: Path) -> None:
    """An OAuth2 client credential of two references; resolved only at use."""
    data = {"catalog": {"properties": {"credential": "${ID}:${SECRET}"}}}
    config = load_config(write(tmp_path, data))
    assert config.catalog.properties["credential"] == "${ID}:${SECRET}"


def test_per_client_properties_reach_their_client_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kafka.consumer_properties`` and the like, as Kafka Connect's overrides."""
    from ingestion.kafka.clients import client_properties
    from resources.factory import kafka_resource

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "b:9092")
    data = {
        "kafka": {
            "properties": {"client.id": "platform"},
            "consumer_properties": {"fetch.max.bytes": 1048576},
            "producer_properties": {"linger.ms": 5, "sasl.password": "${PRODUCER_PASSWORD}"},
        }
    }
    resource = kafka_resource(load_config(write(tmp_path, data)))
    monkeypatch.setenv("PRODUCER_PASSWORD", "s3cret")
    config = resource.client_config()
    assert client_properties(config, "consumer") == {
        "bootstrap.servers": "b:9092",
        "client.id": "platform",
        "fetch.max.bytes": "1048576",
    }
    assert client_properties(config, "producer")["sasl.password"] == "s3cret"
    assert "linger.ms" not in client_properties(config, "admin")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"kafka": {"consumer_properties": {"isolation.level": "read_uncommitted"}}},
            r"kafka\.consumer_properties: .*sets \['isolation\.level'\]",
        ),
        (
            {"kafka": {"admin_properties": {"sasl.password": "hunter2"}}},
            r"kafka\.admin_properties: .*holds a literal secret",
        ),
    ],
)
def test_per_client_properties_are_checked_like_the_shared_ones(
    tmp_path: Path, data: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, data))
