"""The failback plan's cheaper reads give what the full reads give, on real brokers and a real
table: a replica read bounded by a count stops there (one consumer, no wait for more records,
transaction markers between the copies), one scan per topic splits into the per-partition
scans, and the existence probe answers both ways."""

from __future__ import annotations

import sys

import pytest

from ingestion.dr.replica_reader import Replica
from ingestion.dr.rows import holds_rows, ingested_partitions, ingested_tail_where
from tests.support.failback_stack import STAMP, StackFactory, send

pytestmark = pytest.mark.integration


def test_a_bounded_replica_read_is_the_start_of_the_full_read(
    failback_stack: StackFactory,
) -> None:
    # MM2 with exactly-once support: it copies in transactions (markers between the copies).
    eos = {"backup.exactly.once.source.support": "enabled"}
    stack = failback_stack("fbreads", "dr_fbreads", forward={"config": eos})
    with stack.forward_mm2 as forward:
        for first in (0, 10, 20):  # three batches, each copied in its own transactions
            send(stack.source.bootstrap_servers, "fbreads", list(range(first, first + 10)), STAMP)
            assert forward.wait_mirrored("fbreads") == 10
    replica = Replica({"bootstrap.servers": stack.replica.bootstrap_servers})
    full, end = replica.read(stack.copy, 0, 0, sys.maxsize)
    assert [r.key for _, r in full] == [f"k{n}".encode() for n in range(0, 30, 2)]
    assert full[-1][0] > len(full) - 1  # the markers took offsets: not 0..14
    for count in (1, 4, 5, 6, 15, 16):
        assert replica.read(stack.copy, 0, 0, count) == (full[:count], end)
    middle = full[6][0]
    assert replica.read(stack.copy, 0, middle, 3) == (full[6:9], end)
    assert replica.read(stack.copy, 0, end, 5) == ([], end)
    assert replica.read(stack.copy, 0, 0, 0) == ([], end)


def test_one_scan_per_topic_splits_into_the_partition_scans(
    failback_stack: StackFactory,
) -> None:
    stack = failback_stack("fbscans", "dr_fbscans")
    send(stack.source.bootstrap_servers, "fbscans", list(range(12)), STAMP)
    stack.ingest_route()
    tables = [stack.catalog.load_table(stack.spec.table)]
    quarantine = stack.spec.quarantine_table
    if quarantine and stack.catalog.table_exists(quarantine):
        tables.append(stack.catalog.load_table(quarantine))
    split = ingested_partitions(tables, "fbscans", "_kafka_offset >= 2")
    for partition in (0, 1):
        alone = ingested_tail_where(tables, ("fbscans", partition), "_kafka_offset >= 2")
        assert split[partition] == alone
        assert [offset for offset, _ in alone] == [2, 3, 4, 5]
    assert [r.key for _, r in split[1]] == [b"k5", b"k7", b"k9", b"k11"]
    assert holds_rows(tables, ("fbscans", 0), "_kafka_offset <= 0")
    assert not holds_rows(tables, ("fbscans", 0), "_kafka_offset > 5")
    assert not holds_rows(tables, ("other", 0), "_kafka_offset >= 0")
