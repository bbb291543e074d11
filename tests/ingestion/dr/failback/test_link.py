"""A failback anchored before the failover, aligned through the origin (``OriginLink``): the
anchor's identity found among the origin rows the table read before the failover, the reverse
copy checked one for one against the origin's rows after it and the replica's rows since, and
refused (never guessed) when no origin row continues like the reverse copy. The table's rows
are written as the engine writes them (real SQL catalog); the reverse copies are hand-made
topics on the session broker."""

from __future__ import annotations

import datetime as dt
import logging

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table

from ingestion.dr.align import Alignment, RecordId, key_digest
from ingestion.dr.failback.link import OriginLink
from ingestion.dr.replica_reader import Replica
from ingestion.exceptions import FailoverRefusedError, ReplicaBehindError
from ingestion.table.schema import load_or_create_table
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.pipelines import CreateTopic, make_spec

pytestmark = pytest.mark.integration

T = 1_790_000_000_000
# The table read orders[0] 0..5 on the primary before the failover (N = 6); the replica's
# primary.orders[0] 0..5 are their copies, and the table read 6..8 there since (D = 6).
ORIGIN = [(o, T + o, b"k%d" % o) for o in range(6)]
ON_REPLICA = [(o, T + 100 + o, b"r%d" % o) for o in range(6, 9)]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    catalog = IcebergCatalogResource(state_dir=str(tmp_path_factory.mktemp("link"))).load_catalog()
    table = load_or_create_table(catalog, make_spec("orders", "link"))
    rows = [
        {
            "id": o,
            "_kafka_topic": topic,
            "_kafka_partition": 0,
            "_kafka_offset": o,
            "_kafka_timestamp": dt.datetime.fromtimestamp(ms / 1000, dt.UTC),
            "_kafka_key": key.decode(),
        }
        for topic, records in (("orders", ORIGIN), ("primary.orders", ON_REPLICA))
        for o, ms, key in records
    ]
    table.append(pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema())))
    return table


def reverse_copy(
    kafka: KafkaResource, create_topic: CreateTopic, records: list[tuple[int, int, bytes]]
) -> str:
    """A topic whose offsets 0.. hold records with these (timestamp, key), as MM2's reverse
    flow copies the replica partition back to the primary."""
    topic = create_topic(partitions=1)
    producer = kafka.get_producer(logger=logging.getLogger("tests.link"))
    for _, ms, key in records:
        producer.produce(topic, b"v", key, partition=0, timestamp=ms)
        assert producer.flush(10) == 0  # one record per batch: Tansu's end offsets are exact
    return topic


def link(reverse: str, source_down: bool = False) -> OriginLink:
    """The link of replica partition primary.orders[0] to origin orders[0] (N = D = 6)."""
    return OriginLink(
        ("primary.orders", 0), 9, reverse, ("orders", 0), 6, 6, "p", source_down=source_down
    )


ANCHOR = (3, RecordId(T + 3, b"k3"))  # reverse copy offset 3: a copy of origin record 3


def test_the_reverse_copy_continues_like_the_origin_then_the_replica(
    table: Table, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    reverse = reverse_copy(kafka, create_topic, ORIGIN + ON_REPLICA)
    aligned = link(reverse)([table], Replica(kafka.client_config(), 5.0), ANCHOR)
    assert aligned == Alignment(start=9, skipped=5)  # 4, 5 of the origin; 6..8 of the replica


def test_an_anchor_no_origin_row_has_is_refused(
    table: Table, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    reverse = reverse_copy(kafka, create_topic, ORIGIN + ON_REPLICA)
    stranger = (3, RecordId(T + 3, b"nobody"))
    with pytest.raises(FailoverRefusedError, match="matches 0 record"):
        link(reverse)([table], Replica(kafka.client_config(), 5.0), stranger)


def test_a_reverse_copy_that_is_not_a_copy_is_refused_with_its_reason(
    table: Table, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    other = [*ORIGIN, *ON_REPLICA[:1], (7, T + 500, b"zz"), *ON_REPLICA[2:]]
    reverse = reverse_copy(kafka, create_topic, other)
    with pytest.raises(ReplicaBehindError, match="replica offset 7 should be a copy"):
        link(reverse)([table], Replica(kafka.client_config(), 5.0), ANCHOR)


def test_with_the_replica_lost_the_records_it_kept_uncopied_are_named(
    table: Table, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    """The reverse copy ends before the table's last replica record (8): that one is uncopied,
    recorded for the late-copy guard; a copy ending before the failover's start is refused."""
    short = reverse_copy(kafka, create_topic, ORIGIN + ON_REPLICA[:2])
    aligned = link(short, source_down=True)([table], Replica(kafka.client_config(), 5.0), ANCHOR)
    assert (aligned.start, aligned.skipped, aligned.uncopied) == (8, 4, 1)
    assert aligned.uncopied_records == ((8, T + 108, key_digest(b"r8")),)
    shorter = reverse_copy(kafka, create_topic, ORIGIN[:5])
    with pytest.raises(FailoverRefusedError, match="ends before the records the table read"):
        link(shorter, source_down=True)([table], Replica(kafka.client_config(), 5.0), ANCHOR)
