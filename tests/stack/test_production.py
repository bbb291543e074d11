"""A production-shaped stack, configured only through the platform configuration (PLATFORM_CONFIG).

Kafka reached only over SASL_SSL (SCRAM-SHA-512, a certificate from a CA of the test session's
own: the session's secured broker, tests/support/tls.py); an Iceberg REST catalog (Iceberg's
reference RESTCatalogServer in its own JVM, tests/support/rest_catalog.py) whose JDBC catalog is
on a real PostgreSQL server (password auth over TCP) and whose warehouse is on an S3 API (moto's
server; the REST server writes metadata through S3FileIO, pyiceberg and the Spark executors write
data files through pyarrow's S3FileSystem and the configuration's FileIO properties); Dagster's
run and event storage on the same PostgreSQL. On it: an ingestion through Dagster with its
checks, ``platform status`` / ``validate`` / ``maintain`` from a shell holding only the
configuration, dbt reading the table through the catalog, orphan removal on S3 paths,
``platform reset`` (its active runs counted in the PostgreSQL instance), a second ingestion, and
the oracle each time. The secrets (the SCRAM password, the database password, the S3 secret key)
never reach run or event storage, table metadata, command output or the catalog server's log.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from dagster import AssetKey, DagsterInstance, materialize

from ingestion.pipeline.recovery import remove_orphan_files
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.cli.main import main
from platform_assets.dbt.assets import build_dbt_assets, dbt_resource, load_dbt_project
from platform_assets.pipelines import PIPELINES_FILE, load_pipelines
from platform_assets.resources import build_resources
from resources.config import load_config
from resources.kafka import KafkaResource
from tests.platform_assets.dbt.test_assets import expected_revenue, mart_totals, orders
from tests.support.dagster_runs import materialize_pipeline
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import CreateTopic, Harness
from tests.support.postgres import PostgresServer
from tests.support.rest_catalog import RestCatalogServer
from tests.support.s3 import S3Server, s3_server

if TYPE_CHECKING:  # cryptography is imported by the fixture that makes the CA, not here
    from tests.support.tls import SecureBroker

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
PG_PASSWORD_ENV, S3_SECRET_ENV = "PLATFORM_TEST_PG_PASSWORD", "PLATFORM_TEST_S3_SECRET"
KAFKA_PASSWORD_ENV = "PLATFORM_TEST_KAFKA_PASSWORD"


@dataclass
class Production:
    """The running stack: the configuration file, the secrets' environment, the Dagster home."""

    config_path: Path
    secret_env: dict[str, str]
    dagster_home: Path
    dbt_dir: Path
    rest_catalog: RestCatalogServer
    kafka_pid: int | None

    def shell_env(self) -> dict[str, str]:
        """A shell's environment holding only the configuration (and PATH, a fresh HOME)."""
        return {
            "PATH": os.environ["PATH"],
            "HOME": str(self.dbt_dir),
            "PYTHONPATH": str(ROOT),
            "PLATFORM_CONFIG": str(self.config_path),
            **self.secret_env,
        }


def write_config(tmp: Path, secure: SecureBroker, rest_catalog_uri: str, s3: S3Server) -> Path:
    """The deployment's configuration file; secrets are ``${NAME}`` references."""
    pipelines = yaml.safe_load(PIPELINES_FILE.read_text())
    (tmp / "pipelines.yaml").write_text(yaml.safe_dump(pipelines))
    config = {
        "kafka": {
            "bootstrap_servers": secure.bootstrap_servers,  # the SASL_SSL listener only
            "properties": {
                "client.id": "platform-prod-test",
                "socket.timeout.ms": 30000,
                **secure.client_properties(),  # SASL_SSL, SCRAM-SHA-512, ssl.ca.location
                "sasl.username": secure.user,
                "sasl.password": f"${{{KAFKA_PASSWORD_ENV}}}",
            },
        },
        "catalog": {"name": "prod", "properties": {"type": "rest", "uri": rest_catalog_uri}},
        "file_io": {
            "s3.endpoint": s3.endpoint,
            "s3.access-key-id": s3.access_key,
            "s3.secret-access-key": f"${{{S3_SECRET_ENV}}}",
            "s3.region": s3.region,
        },
        "spark": {"master": "local[2,2]", "app_name": "platform-tests"},
        "pipelines_file": str(tmp / "pipelines.yaml"),
    }
    path = tmp / "platform.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def rest_catalog_properties(pg: PostgresServer, s3: S3Server, s3_secret: str) -> dict[str, str]:
    """The catalog service's own configuration: a JDBC catalog on PostgreSQL, S3FileIO on the
    S3 API, the warehouse under ``s3://warehouse/lake``."""
    return {
        "uri": f"jdbc:postgresql://127.0.0.1:{pg.port}/rest_catalog",
        "jdbc.user": pg.user,
        "jdbc.password": pg.password,
        "warehouse": "s3://warehouse/lake",
        "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "s3.endpoint": s3.endpoint,
        "s3.path-style-access": "true",
        "s3.access-key-id": s3.access_key,
        "s3.secret-access-key": s3_secret,
        "client.region": s3.region,
    }


def write_dagster_home(home: Path, pg: PostgresServer) -> None:
    """A Dagster instance whose run, event and schedule storage is the PostgreSQL server."""
    home.mkdir()
    storage = {
        "postgres": {
            "postgres_db": {
                "username": pg.user,
                "password": {"env": PG_PASSWORD_ENV},
                "hostname": "127.0.0.1",
                "port": pg.port,
                "db_name": "dagster",
                # SQLAlchemy 2.1 maps plain postgresql:// to psycopg 3; dagster-postgres
                # 0.29.27 ships psycopg2-binary.
                "scheme": "postgresql+psycopg2",
            }
        }
    }
    (home / "dagster.yaml").write_text(yaml.safe_dump({"storage": storage}))


@pytest.fixture(scope="module")
def kafka(secure_broker: SecureBroker) -> KafkaResource:
    """The test's own clients (topics, the ledger's producer) reach the secured broker too."""
    return secure_broker.kafka()


@pytest.fixture(scope="module")
def production(
    secure_broker: SecureBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Production]:
    """PostgreSQL, S3 and the REST catalog for the module; the process environment holds only
    the configuration's name and its secrets (the embedded stack's variables are removed)."""
    tmp = tmp_path_factory.mktemp("production")
    secret_env = {
        PG_PASSWORD_ENV: f"pg-{secrets.token_hex(8)}",
        S3_SECRET_ENV: f"s3-{secrets.token_hex(8)}",
        KAFKA_PASSWORD_ENV: secure_broker.password,
    }
    with (
        PostgresServer(secret_env[PG_PASSWORD_ENV]) as pg,
        s3_server(tmp / "moto.log", "warehouse") as s3,
        pytest.MonkeyPatch.context() as env,
    ):
        pg.create_database("rest_catalog")
        pg.create_database("dagster")
        properties = rest_catalog_properties(pg, s3, secret_env[S3_SECRET_ENV])
        with RestCatalogServer(tmp / "rest-catalog.log", properties) as rest_catalog:
            production = Production(
                write_config(tmp, secure_broker, rest_catalog.uri, s3),
                secret_env,
                tmp / "dagster_home",
                tmp / "dbt",
                rest_catalog,
                secure_broker.broker.pid,
            )
            write_dagster_home(production.dagster_home, pg)
            production.dbt_dir.mkdir()
            for name in ("KAFKA_BOOTSTRAP_SERVERS", "PLATFORM_PIPELINES_FILE", "DAGSTER_HOME"):
                env.delenv(name, raising=False)
            for name, value in {
                **secret_env,
                "PLATFORM_CONFIG": str(production.config_path),
            }.items():
                env.setenv(name, value)
            env.setenv("PLATFORM_STATE_DIR", str(production.dbt_dir))  # dbt's own DuckDB file only
            yield production


def ingest_through_dagster(spec: PipelineSpec, production: Production) -> str:
    """Materialize the pipeline's assets and checks in the PostgreSQL-backed instance; return
    where the files were written (``spark``: by the executors, through the FileIO properties)."""
    with DagsterInstance.from_config(str(production.dagster_home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        result = materialize_pipeline(spec, build_resources(), instance=instance)
        assert result.success
        failed = [e.check_name for e in result.get_asset_check_evaluations() if not e.passed]
        assert failed == []
        records = instance.get_records_for_run(result.run_id).records
        stored = " ".join(str(record.event_log_entry) for record in records)
        stored += str(instance.get_run_by_id(result.run_id))
    assert not any(secret in stored for secret in production.secret_env.values())
    (table,) = [
        m.materialization
        for m in result.get_asset_materialization_events()
        if m.materialization.asset_key == AssetKey(["iceberg", *spec.table.split(".")])
    ]
    return str(table.metadata["executed_in"].value)


def rss_mb(pid: int | None) -> int:
    """The resident set of process ``pid`` now, in MB (``ps``)."""
    done = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True)
    return int(done.stdout.strip() or 0) // 1024


def run_cli(production: Production, *args: str) -> str:
    """``platform ARGS`` in a subprocess whose environment holds only the configuration."""
    done = subprocess.run(
        [sys.executable, "-m", "platform_assets.cli.main", *args],
        env=production.shell_env(),
        cwd=production.dbt_dir,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert not any(secret in done.stdout + done.stderr for secret in production.secret_env.values())
    return done.stdout


def test_production_stack_end_to_end(
    production: Production,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    topic = create_topic(partitions=3)
    pipelines = yaml.safe_load(Path(load_config().pipelines_file).read_text())
    pipelines["pipelines"][0]["topic"] = topic
    # Spark executors, not the run process, must write to S3 with the catalog's FileIO settings.
    pipelines["pipelines"][0]["in_process_max_records"] = 0
    Path(load_config().pipelines_file).write_text(yaml.safe_dump(pipelines))
    (spec,) = load_pipelines()
    resources = build_resources()
    catalog = resources["iceberg"].load_catalog()
    assert type(catalog).__name__ == "RestCatalog"
    kafka = resources["kafka"]
    oracle = Harness(kafka, catalog, None, kafka.get_cluster_id())  # type: ignore[arg-type]
    produced = ledger_producer.produce(topic, orders(0, 90, duplicates=6, seed=11))

    assert ingest_through_dagster(spec, production) == "spark"
    oracle.assert_exactly_once(spec, ledger)
    table = catalog.load_table(spec.table)
    data_path = table.location_provider().data_path
    assert data_path.startswith("s3://warehouse/lake/")
    assert table.scan().to_arrow().num_rows == 96

    status = run_cli(production, "status", "--audit")  # the audit's recount too
    with capsys.disabled():  # shown with -s: the output from a shell with only the config
        print(f"\n--- platform status (only PLATFORM_CONFIG and its secrets set) ---\n{status}")
    assert f"orders  table={spec.table}  group={spec.consumer_group_id}" in status
    assert "lag: 0 records" in status
    assert "checks: all 6 pass" in status
    assert "valid; catalog 'prod' (properties)" in run_cli(production, "validate")

    project = load_dbt_project()
    built = materialize([build_dbt_assets(project)], resources={"dbt": dbt_resource(project)})
    assert built.success
    assert mart_totals(production.dbt_dir) == expected_revenue(produced)
    assert not (production.dbt_dir / "catalog.db").exists()  # read through PostgreSQL + S3

    orphan = f"{data_path}/orphan-from-a-crashed-run.parquet"
    with table.io.new_output(orphan).create() as stream:
        stream.write(b"not referenced by any snapshot")
    removed = remove_orphan_files(catalog.load_table(spec.table), older_than_s=0)
    assert [o.path for o in removed] == [orphan.removeprefix("s3://")]
    assert not table.io.new_input(orphan).exists()
    maintained = run_cli(production, "maintain", "orders", "--retention-hours", "0", "--apply")
    assert "FAILED" not in maintained
    oracle.assert_exactly_once(spec, ledger)

    os.environ["DAGSTER_HOME"] = str(production.dagster_home)
    try:
        assert main(["reset", "orders", "--to", "earliest", "--apply", "--reason", "prod"]) == 0
    finally:
        del os.environ["DAGSTER_HOME"]
    reset = capsys.readouterr().out
    assert "0 active ingestion run(s) of 'orders' in the Dagster instance" in reset
    assert "committed in snapshot" in reset
    assert catalog.load_table(spec.table).scan().to_arrow().num_rows == 0
    ledger_producer.produce(topic, orders(90, 20, duplicates=0, seed=12))
    assert ingest_through_dagster(spec, production) == "spark"
    oracle.assert_exactly_once(spec, ledger)
    table = catalog.load_table(spec.table)
    assert table.scan().to_arrow().num_rows == 116
    stored = str(table.metadata.properties) + "".join(str(s.summary) for s in table.snapshots())
    assert not any(secret in stored for secret in production.secret_env.values())
    served = production.rest_catalog.read_log(max_chars=10**7)
    assert not any(secret in served for secret in production.secret_env.values())
    with capsys.disabled():
        print(f"production-shaped test body: {time.monotonic() - started:.1f} s")
        print(
            f"REST catalog: started in {production.rest_catalog.started_in_s:.1f} s, "
            f"RSS {rss_mb(production.rest_catalog.pid)} MB; secured broker: RSS "
            f"{rss_mb(production.kafka_pid)} MB"
        )
