"""The real thing end to end: Debezium's PostgreSQL connector (Kafka Connect, ``pgoutput``) on a
real PostgreSQL writes a table's changes to Apache Kafka; ``mode: upsert`` runs on Spark leave
the Iceberg table, read by DuckDB from its live files, equal to the PostgreSQL table, row for row
(R57 in docs/reliability.md). ``tests/support/debezium.py`` is the envelope written from the
spec, for the tests that need thousands of changes or SIGKILLs; this test checks it against
what Debezium really writes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from resources.kafka import KafkaResource
from tests.support.debezium import cdc_spec, state_by_duckdb
from tests.support.debezium_connect import SETTINGS, DebeziumConnect
from tests.support.pipelines import Harness
from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.integration

CREATE = """
create table public.customers (
    id integer primary key,
    name varchar(40) not null,
    balance numeric(10, 2),
    updated_at timestamptz not null default now()
)
"""
STATE = """
select id, name, balance::text,
       to_char(updated_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
from public.customers
"""


def postgres_state(cursor: Any) -> dict[int, dict[str, Any]]:
    cursor.execute(STATE)
    return {
        row[0]: {"id": row[0], "name": row[1], "balance": row[2], "updated_at": row[3]}
        for row in cursor.fetchall()
    }


def change_rows(cursor: Any, rng: random.Random, count: int, keys: int) -> int:
    """``count`` statements over ids ``0 .. keys - 1``, a tenth of the keys taking half of
    them (an absent id inserted, a present one updated or, one time in five, deleted), some in
    multi-statement transactions; return the events Debezium writes for them (a delete: its
    event and its tombstone)."""
    events = 0
    hot = keys // 10
    for _ in range(count):
        key = rng.randrange(hot) if rng.random() < 0.5 else rng.randrange(keys)
        cursor.execute("select 1 from public.customers where id = %s", (key,))
        if cursor.fetchone() is None:
            cursor.execute(
                "insert into public.customers (id, name, balance) values (%s, %s, %s)",
                (key, f"name-{key}", "0.00"),
            )
            events += 1
        elif rng.random() < 0.2:
            cursor.execute("delete from public.customers where id = %s", (key,))
            events += 2
        else:
            cursor.execute(
                "update public.customers set balance = %s, updated_at = now() where id = %s",
                (f"{rng.randint(0, 99_999)}.{rng.randint(0, 99):02d}", key),
            )
            events += 1
    return events


def test_debeziums_postgres_connector_leaves_the_table_equal_to_postgres(
    harness: Harness, kafka: KafkaResource, tmp_path: Path
) -> None:
    """A snapshot of 150 rows (``op: r``), then hot-key inserts, updates and deletes (with
    tombstones), one statement each and a transaction updating one row three times: after each
    run the Iceberg table is PostgreSQL's table."""
    rng = random.Random(57)
    with PostgresServer("secret", settings=SETTINGS) as pg:
        pg.create_database("inventory")
        connection = pg.connect("inventory")
        cursor = connection.cursor()
        cursor.execute(CREATE)
        cursor.executemany(
            "insert into public.customers (id, name, balance) values (%s, %s, %s)",
            [(key, f"name-{key}", f"{key % 997}.{key % 100:02d}") for key in range(150)],
        )
        database = {
            "port": str(pg.port),
            "user": pg.user,
            "password": pg.password,
            "dbname": "inventory",
        }
        connect = DebeziumConnect(
            tmp_path / "connect", kafka.bootstrap_servers, database, ["public.customers"]
        )
        with connect:
            topic = connect.topic("public.customers")
            spec = cdc_spec(topic, "debezium_postgres")
            events = connect.wait_records(kafka.client_config(), "public.customers", 150)
            report = harness.run(spec)
            assert (report.inserts, report.updates, report.deletes) == (150, 0, 0)
            assert state_by_duckdb(harness.table(spec)) == postgres_state(cursor)

            events += change_rows(cursor, rng, 250, keys=200)
            connection.autocommit = False
            for balance in ("1.00", "2.00", "3.00"):  # one transaction, one key, three changes
                cursor.execute(
                    "update public.customers set balance = %s where id = "
                    "(select min(id) from public.customers)",
                    (balance,),
                )
            connection.commit()
            connection.autocommit = True
            events += 3
            connect.wait_records(kafka.client_config(), "public.customers", events)
            report = harness.run(spec)
            assert report.updates > 0
            assert report.deletes > 0
            assert report.quarantined == 0
            assert report.executed_in == "spark"
            assert state_by_duckdb(harness.table(spec)) == postgres_state(cursor)
        harness.assert_commits_audited(spec)
        connection.close()
