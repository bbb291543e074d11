"""Session fixtures for the real local stack: one Kafka broker, one catalog, one Spark session.

Integration tests never mock Kafka, Iceberg or Spark. The broker's log is attached to the report
of any failing test that used it.
"""

from __future__ import annotations

import gc
import itertools
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ingestion.spec.pipeline import PipelineSpec
from resources.embedded import EmbeddedBroker
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource
from tests.support.brokers import BROKER_STOP_S, is_stopped, reset_cluster, resume_broker
from tests.support.dev_stack import (
    DevStack,
    check_stopped_cleanly,
    launch_shared_stack,
    order_dev_stack_users,
)
from tests.support.ledger import Ledger, LedgerProducer, Record
from tests.support.pipelines import CreateTopic, Harness, NewPipeline, make_spec, records
from tests.support.registry import EmbeddedSchemaRegistry
from tests.support.suite_order import make_scheduler, order_groups
from tests.support.webhook import WebhookReceiver, webhook_receiver

if TYPE_CHECKING:
    from tests.support.failback_stack import StackFactory
    from tests.support.mirror_maker import MirrorMaker
    from tests.support.tls import SecureBroker

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.support.suite_report"]  # the wall time and set-up share, last in the log

TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The options of every JVM the suite starts (Kafka, MirrorMaker 2, Spark, the registry, a
`make dev` stack's servers), through the ``java`` launcher's ``JDK_JAVA_OPTIONS``: C1 only and
one GC thread. A test's JVM lives seconds to minutes on small data, where C2's compilations
cost more CPU than they save: a local Spark session's start and first jobs took 11-12
CPU-seconds instead of 21-22 (docs/architecture.md "How the tests run"). Behaviour does not
change; the benchmarks (bench/) run without it, so their figures are the product's. A value
set before the run wins."""
os.environ.setdefault("JDK_JAVA_OPTIONS", TEST_JVM_OPTIONS)  # workers and their subprocesses


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """An Apache Kafka broker on a free loopback port for the whole session."""
    log_path = tmp_path_factory.mktemp("kafka") / "kafka.log"
    with EmbeddedBroker(log_path=log_path, stop_timeout_s=BROKER_STOP_S) as running:
        yield running
        gc.collect()  # close leftover clients while the broker is up: no reconnect noise


@pytest.fixture(scope="session")
def replica_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A second cluster, the MirrorMaker 2 replica (the session broker is the source)."""
    log_path = tmp_path_factory.mktemp("replica") / "kafka.log"
    with EmbeddedBroker(
        log_path=log_path, name="replica_cluster", stop_timeout_s=BROKER_STOP_S
    ) as running:
        yield running
        gc.collect()  # close leftover clients while the broker is up: no reconnect noise


@pytest.fixture(scope="session")
def shared_mm2(
    broker: EmbeddedBroker, replica_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MirrorMaker]:
    """Real MirrorMaker 2 from the session broker to the replica for the whole session, one
    flow per lane (``tests.support.mirror_maker.LANES``): a test mirrors a topic by naming it
    ``<lane>-...`` and gets checkpoints for a group named likewise."""
    from tests.support.mirror_maker import shared_mirror_maker

    log_path = tmp_path_factory.mktemp("mm2") / "mm2.log"
    mirror = shared_mirror_maker(
        log_path, broker.bootstrap_servers, replica_broker.bootstrap_servers
    )
    with mirror:
        yield mirror


@pytest.fixture(scope="session")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """The session's one secured broker: a SASL_SSL listener (SCRAM-SHA-512) with a certificate
    from a CA made for the session (tests/support/tls.py); clients reach it only that way."""
    from tests.support.tls import secured_broker  # cryptography: loaded by its users only

    with secured_broker(
        tmp_path_factory.mktemp("secured"), stop_timeout_s=BROKER_STOP_S
    ) as running:
        yield running
        gc.collect()  # close leftover clients while the broker is up: no reconnect noise


@pytest.fixture(scope="session")
def dr_cluster_pair(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[EmbeddedBroker, EmbeddedBroker]]:
    """A source and a replica cluster for the DR modules of a worker: ``dr_clusters`` resets
    them for each module (a test may SIGSTOP either; no test shares the session's broker).

    No time-based retention: the failback tests stamp records from a fixed past instant
    (``tests.support.failback_stack.STAMP``), and Kafka's default 7 days, enforced every second
    by the embedded broker, deleted them before MM2 or a run read them."""
    logs = tmp_path_factory.mktemp("dr")
    keep = {"log.retention.ms": "-1"}
    with (
        EmbeddedBroker(
            log_path=logs / "source.log",
            name="source_cluster",
            stop_timeout_s=BROKER_STOP_S,
            config=keep,
        ) as source,
        EmbeddedBroker(
            log_path=logs / "replica.log",
            name="replica_cluster",
            stop_timeout_s=BROKER_STOP_S,
            config=keep,
        ) as replica,
    ):
        yield source, replica
        for running in (source, replica):
            if running.pid:
                os.kill(running.pid, signal.SIGCONT)
        gc.collect()


@pytest.fixture(scope="module")
def dr_clusters(
    dr_cluster_pair: tuple[EmbeddedBroker, EmbeddedBroker],
) -> Iterator[tuple[EmbeddedBroker, ...]]:
    """The worker's cluster pair, as new for the module: resumed if the last module left one
    stopped, every topic and group of the last module deleted
    (``tests.support.brokers.reset_cluster``; a pair per module cost 11 s and two JVMs each)."""
    for running in dr_cluster_pair:
        reset_cluster(running)
    yield dr_cluster_pair
    for running in dr_cluster_pair:
        if is_stopped(running):  # a test's disaster, never resumed: serving again, as it was
            resume_broker(running)
    gc.collect()  # close the module's leftover clients before the next module resets the pair


@pytest.fixture
def failback_stack(
    dr_clusters: tuple[EmbeddedBroker, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[StackFactory]:
    """Builds a pipeline with replica 'dr' on the module's cluster pair, its resources and the
    forward MM2 flow: real MirrorMaker 2, stopped at teardown (tests/support/failback_stack.py)."""
    from tests.support.failback_stack import failback_factory

    running: list[Any] = []
    yield failback_factory(dr_clusters, tmp_path, monkeypatch, running)
    for mirror in running:
        mirror.stop()


@pytest.fixture(scope="session")
def kafka(broker: EmbeddedBroker) -> KafkaResource:
    """The Kafka resource pointed at the session broker."""
    return KafkaResource(bootstrap_servers=broker.bootstrap_servers)


_topic_numbers = itertools.count()


@pytest.fixture
def create_topic(kafka: KafkaResource, request: pytest.FixtureRequest) -> CreateTopic:
    """Create a fresh topic named after the test; return its name."""
    from confluent_kafka.admin import NewTopic

    def _create(partitions: int = 3, name: str | None = None, **config: str) -> str:
        topic = name or f"t{next(_topic_numbers)}-{request.node.name[:40]}".replace("[", "-")
        topic = "".join(c if c.isalnum() or c in "-_." else "-" for c in topic)
        admin = kafka.get_admin_client()
        futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config)])
        for future in futures.values():
            future.result(15)
        return topic

    return _create


@pytest.fixture(scope="session")
def demo_topic(kafka: KafkaResource) -> str:
    """The demo pipeline's ``orders`` topic (pipelines.yaml), created once per session."""
    from confluent_kafka.admin import NewTopic

    admin = kafka.get_admin_client()
    for future in admin.create_topics([NewTopic("orders", 4, 1)]).values():
        future.result(15)
    return "orders"


@pytest.fixture
def ledger() -> Ledger:
    """An empty ledger for the test."""
    return Ledger()


@pytest.fixture
def ledger_producer(kafka: KafkaResource, ledger: Ledger) -> LedgerProducer:
    """A producer that records every acknowledged record in ``ledger``."""
    return LedgerProducer(kafka, ledger)


@pytest.fixture
def new_pipeline(create_topic: CreateTopic, ledger_producer: LedgerProducer) -> NewPipeline:
    """Create a fresh topic and a small JSON pipeline on it (``make_spec``), produce its first
    records through the ledger (``produce``: a count of ``records``, or the records); return
    (topic, spec)."""

    def _new(
        name: str, partitions: int = 1, produce: int | list[Record] = 0, **overrides: Any
    ) -> tuple[str, PipelineSpec]:
        topic = create_topic(partitions=partitions)
        spec = make_spec(topic, name, **overrides)
        if produce:
            ledger_producer.produce(
                topic, records(produce) if isinstance(produce, int) else produce
            )
        return topic, spec

    return _new


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    """A webhook receiver on a free loopback port for the test: ``url``, ``received``."""
    with webhook_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def dev_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    """One `make dev` for the tests that need it (tests/support/dev_stack.py), run last; stopped
    after its last user, checking that Ctrl-C left nothing running, unless a test stopped it."""
    with webhook_receiver() as receiver:
        stack = launch_shared_stack(tmp_path_factory.mktemp("dev-stack"), receiver)
        try:
            yield stack
        finally:
            if stack.output is None:  # no test stopped it
                check_stopped_cleanly(stack)


JVM_FIXTURES = frozenset(
    {
        "broker",
        "replica_broker",
        "secure_broker",
        "dr_clusters",
        "dr_cluster_pair",
        "dev_stack",
        "spark_resource",
        "schema_registry",
    }
)
"""The session's servers that run in a JVM (Kafka, MirrorMaker 2, Spark, the registry): a test
whose fixtures reach one of them needs Java, as one marked ``integration`` or ``slow`` does."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that needs a JVM is marked ``jvm`` (``make check`` runs the others); the users
    of the shared `make dev` stack run together, in their order (``dev_stack``), last in one
    process; under pytest-xdist (``make test``) the groups of tests/support/suite_order.py run
    longest first."""
    for item in items:
        named = {"integration", "slow"} & {mark.name for mark in item.iter_markers()}
        if named or JVM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.jvm)
    order_dev_stack_users(items)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # collected on each worker, the same way
        order_groups(items)  # keeps the order inside a group: the stack's users' above


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """One worker per group (tests/support/suite_order.py), under ``--dist loadscope``."""
    return make_scheduler(config, log)


@pytest.fixture(scope="session")
def catalog_resource(tmp_path_factory: pytest.TempPathFactory) -> IcebergCatalogResource:
    """The embedded SQLite catalog with its warehouse in a temporary folder."""
    return IcebergCatalogResource(state_dir=str(tmp_path_factory.mktemp("iceberg")))


@pytest.fixture(scope="session")
def spark_resource() -> Iterator[SparkResource]:
    """One local Spark session for the whole test session: 2 task slots, 2 attempts per task."""
    resource = SparkResource(master="local[2,2]", app_name="platform-tests")
    yield resource
    resource.stop_session()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedSchemaRegistry]:
    """A real Schema Registry (Apicurio Registry's Confluent-compatible API, in-memory storage)
    on a free loopback port for the whole session: ``url`` is a ``schema_registry_url``. Each
    test uses subjects of its own (its topics are fresh)."""
    log_path = tmp_path_factory.mktemp("schema-registry") / "registry.log"
    with EmbeddedSchemaRegistry(log_path) as running:
        yield running


@pytest.fixture(scope="session")
def harness(
    kafka: KafkaResource, catalog_resource: IcebergCatalogResource, spark_resource: SparkResource
) -> Harness:
    """Runs pipelines on the session's broker, catalog and Spark, and audits them."""
    return Harness(
        kafka,
        catalog_resource.load_catalog(),
        spark_resource.spark_session,
        kafka.get_cluster_id(),
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    """Attach the broker's log to the report of a failing test that used the broker."""
    outcome: Any = yield
    report = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    if report.failed and "broker" in getattr(item, "fixturenames", ()):
        running = funcargs.get("broker")
        if isinstance(running, EmbeddedBroker):
            report.sections.append(("broker log (tail)", running.read_log(8_000)))


@pytest.fixture
def resources(
    kafka: KafkaResource, catalog_resource: IcebergCatalogResource, spark_resource: SparkResource
) -> dict[str, Any]:
    """The resources a pipeline's Dagster assets and checks need, on the session's stack."""
    return {"kafka": kafka, "iceberg": catalog_resource, "spark": spark_resource}


@pytest.fixture(autouse=True)
def no_current_dagster_instance() -> Iterator[None]:
    """Each test starts with no Dagster instance current, as a fresh process does.

    Entering a ``DagsterInstance`` (``with instance:``) makes its defs-state storage current for
    the thread until the instance is exited; building a ``Definitions`` reads that storage. An
    instance a test left entered, then garbage-collected, made every later definitions build in
    the session fail with "Attempted to resolve undefined DagsterInstance weakref" (seen in a
    full run, depending on test order). ``set_defs_state_storage`` lives in a private Dagster
    module (dagster 1.13.27); it is used here only, and only to reset that context.
    """
    from dagster._core.storage.defs_state.base import set_defs_state_storage

    with set_defs_state_storage(None):
        yield
