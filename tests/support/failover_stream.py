"""A steady stream for failover tests and its oracle by source record identity (the key)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

from tests.support.pipelines import records

BAD = frozenset({57, 104, 105, 141})  # malformed values: quarantined, near the switches


def produce(bootstrap: str, topic: str, first: int, count: int) -> None:
    """Records ``first..first+count-1`` on partitions 0 and 1 (partition 2 stays empty)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value, _ in records(count, first=first):
        number = int((key or b"k0")[1:])
        bad = b"{not json" if number in BAD else value
        producer.produce(topic, value=bad, key=key, partition=number % 2)
        producer.flush(10)  # one record per batch (Tansu's end offset is its last batch's base + 1)


def oracle(catalog: Any, spec: Any, expected: int) -> None:
    """Every record once, in the data table or (the malformed ones) the quarantine table."""
    data = catalog.load_table(spec.table).scan(selected_fields=("_kafka_key",)).to_arrow()
    bad = catalog.load_table(spec.quarantine_table).scan(selected_fields=("_kafka_key",))
    found = data.column("_kafka_key").to_pylist()
    found += [k.decode() for k in bad.to_arrow().column("_kafka_key").to_pylist()]
    twice = sorted({k for k in found if found.count(k) > 1})
    assert not twice, f"records landed twice: {twice}"
    missing = sorted({f"k{i}" for i in range(expected)} - set(found))
    assert not missing, f"records are missing: {missing}"
    assert len(found) == expected, f"unexpected records: {sorted(set(found))}"
