"""Debezium's PostgreSQL connector, the real one, in a standalone Kafka Connect worker
(``org.apache.kafka.connect.cli.ConnectStandalone``, class path ``resources/jvm/debezium/pom.xml``)
against a real PostgreSQL (:class:`tests.support.postgres.PostgresServer` with
``wal_level=logical``), writing to the session's Apache Kafka broker.

The connector runs as Debezium ships it: the ``pgoutput`` logical decoding plugin, an initial
snapshot (``op: r``) then streaming, the JSON converter with schemas, tombstones after deletes.
Only ``decimal.handling.mode=string`` is set (the JSON form of a precise decimal is base64 bytes,
which a ``decimal`` column does not read; with the Avro converter ``precise`` works:
docs/cdc.md). The worker's offsets go to a file; its REST listener to a free loopback port.

Its start takes ~10-20 s on 2 cores (JVM, plugin scan, snapshot); a test waits for records by
the topic's high watermark, not by sleeping.
"""

from __future__ import annotations

import time
from pathlib import Path

from ingestion.kafka.topics import query_watermarks
from resources.jvm import LOG4J2_CONFIG, class_path
from tests.support.jvm_server import JvmServer

MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"
CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
SETTINGS = {"wal_level": "logical", "max_wal_senders": "4", "max_replication_slots": "4"}


class DebeziumConnect(JvmServer):
    """One Connect worker running one Debezium PostgreSQL connector for ``tables``
    (``schema.table``) of ``database``; its topics are ``<prefix>.<schema>.<table>``. It serves
    once its REST API answers; the connector then snapshots and streams: wait for its records
    with :meth:`wait_records`."""

    name = "Kafka Connect (Debezium)"

    def __init__(
        self,
        root: Path,
        bootstrap: str,
        database: dict[str, str],
        tables: list[str],
        prefix: str = "dbserver1",
        heap_mb: int = 256,
        start_timeout_s: float = 90,
    ) -> None:
        super().__init__(root / "connect.log", heap_mb, start_timeout_s, stop_timeout_s=20)
        self.root, self.bootstrap, self.database = root, bootstrap, database
        self.tables, self.prefix = tables, prefix

    def topic(self, table: str) -> str:
        return f"{self.prefix}.{table}"

    def worker_properties(self, port: int) -> dict[str, str]:
        return {
            "bootstrap.servers": self.bootstrap,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "offset.storage.file.filename": str(self.root / "connect.offsets"),
            "offset.flush.interval.ms": "1000",
            "listeners": f"http://127.0.0.1:{port}",
            "plugin.discovery": "service_load",  # the class path's manifests, no jar scan
        }

    def connector_properties(self) -> dict[str, str]:
        return {
            "name": f"{self.prefix}-postgres",
            "connector.class": CONNECTOR,
            "tasks.max": "1",
            "database.hostname": "127.0.0.1",
            "database.port": self.database["port"],
            "database.user": self.database["user"],
            "database.password": self.database["password"],
            "database.dbname": self.database["dbname"],
            "topic.prefix": self.prefix,
            "plugin.name": "pgoutput",
            "slot.name": f"{self.prefix}_slot",
            "publication.autocreate.mode": "filtered",
            "table.include.list": ",".join(self.tables),
            "snapshot.mode": "initial",
            "decimal.handling.mode": "string",
            "topic.creation.default.replication.factor": "1",
            "topic.creation.default.partitions": "1",
        }

    def main(self, port: int) -> tuple[str, str, list[str], dict[str, str]]:
        """The worker's and the connector's properties files, for ``ConnectStandalone``."""
        self.root.mkdir(parents=True, exist_ok=True)
        files = []
        for name, properties in (
            ("worker", self.worker_properties(port)),
            ("connector", self.connector_properties()),
        ):
            path = self.root / f"{name}.properties"
            path.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
            files.append(str(path))
        cp = class_path("debezium")
        arguments = [f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}", "-cp", cp, MAIN, *files]
        return MAIN, cp, arguments, {}

    def serves(self) -> bool:
        """Listening is enough: the worker opens its REST port once its connector is loaded."""
        return True

    def wait_records(
        self, client_config: dict[str, str], table: str, count: int, timeout_s: float = 60
    ) -> int:
        """Wait until ``table``'s topic (one partition) holds at least ``count`` records;
        return its end offset."""
        from confluent_kafka import Consumer, KafkaException

        consumer = Consumer({**client_config, "group.id": "debezium-wait"})
        try:
            deadline = time.monotonic() + timeout_s
            held = 0
            while time.monotonic() < deadline:
                try:
                    low, high = query_watermarks(consumer, self.topic(table), 0, timeout_s=2)
                    held = high - low
                except KafkaException:  # the topic is created with the first record
                    held = 0
                if held >= count:
                    return held
                time.sleep(0.3)
        finally:
            consumer.close()
        raise RuntimeError(
            f"{self.topic(table)} holds {held} records, waited for {count}:\n{self.read_log()}"
        )
