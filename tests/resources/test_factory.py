"""Resources: configuration to client objects, with secrets kept out of the way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from resources.iceberg import IcebergCatalogResource, embedded_catalog_properties
from resources.kafka import KafkaResource
from resources.spark import SparkResource, session_config, zip_engine_package


def test_kafka_client_config_merges_pass_through_and_secrets() -> None:
    kafka = KafkaResource(
        bootstrap_servers="b1:9092",
        client_properties={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
        sasl_username="user",
        sasl_password="pw",
    )
    assert kafka.client_config() == {
        "bootstrap.servers": "b1:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "user",
        "sasl.password": "pw",
    }


@pytest.mark.parametrize(
    "owned", ["enable.auto.commit", "auto.offset.reset", "isolation.level", "group.id"]
)
def test_kafka_rejects_engine_owned_properties(owned: str) -> None:
    with pytest.raises(ValueError, match=f"'{owned}'"):
        KafkaResource(bootstrap_servers="b:1", client_properties={owned: "x"})


@pytest.mark.parametrize(
    ("resource", "settings", "misspelt"),
    [
        ("KafkaResource", {"bootstrap_servers": "b:1", "sasl_pasword": "x"}, "sasl_pasword"),
        ("IcebergCatalogResource", {"state_dirr": "/tmp/x"}, "state_dirr"),
        ("SparkResource", {"mastr": "local[1]"}, "mastr"),
        ("AlertResource", {"webhook": "http://x"}, "webhook"),
    ],
)
def test_misspelt_resource_setting_fails_at_load(
    resource: str, settings: dict[str, str], misspelt: str
) -> None:
    """A typo is an error when the definitions load, never a silently ignored setting."""
    import resources.alerts
    import resources.iceberg
    import resources.kafka
    import resources.spark

    modules = (resources.alerts, resources.iceberg, resources.kafka, resources.spark)
    cls = next(getattr(m, resource) for m in modules if hasattr(m, resource))
    with pytest.raises(ValueError, match=misspelt):
        cls(**settings)


def test_secret_from_env_var_is_resolved_at_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster import EnvVar

    kafka = KafkaResource(bootstrap_servers="b:1", sasl_password=EnvVar("TEST_KAFKA_PASSWORD"))
    assert "s3cret" not in repr(kafka)
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", "s3cret")
    config = kafka.process_config_and_initialize().client_config()
    assert config["sasl.password"] == "s3cret"


def test_embedded_catalog_properties_live_under_state_dir(tmp_path: Path) -> None:
    props = embedded_catalog_properties(tmp_path)
    assert props == {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
    }


def test_catalog_properties_pass_through_and_credential() -> None:
    resource = IcebergCatalogResource(
        catalog_name="prod", properties={"type": "rest", "uri": "http://r"}, credential="id:key"
    )
    assert resource.catalog_properties() == {
        "type": "rest",
        "uri": "http://r",
        "credential": "id:key",
    }


def test_spark_local_workers_use_this_interpreter() -> None:
    config = session_config("local[*]", "app", {"spark.executor.memory": "1g"})
    assert config["spark.pyspark.python"] == sys.executable
    assert config["spark.executor.memory"] == "1g"
    cluster = session_config("spark://master:7077", "app", {})
    assert "spark.pyspark.python" not in cluster


def test_spark_remote_must_resolve_to_a_connect_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``spark.remote`` reference is resolved when the session is needed; what it resolves
    to must be ``sc://``, refused before any connection with the key and the fix named."""
    monkeypatch.setenv("SPARK_REMOTE_X", "http://spark:15002")
    resource = SparkResource(remote="${SPARK_REMOTE_X}")
    with pytest.raises(ValueError, match=r"spark\.remote resolves to 'http://spark:15002'.*sc://"):
        resource.spark_session  # noqa: B018 - the property connects


def test_engine_zip_contains_the_package() -> None:
    import zipfile

    with zipfile.ZipFile(zip_engine_package()) as archive:
        names = archive.namelist()
    assert "ingestion/__init__.py" in names
    assert "ingestion/spec/pipeline.py" in names
