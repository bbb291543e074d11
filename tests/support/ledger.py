"""A producer that records every acknowledged record: the ground truth of the oracle.

Each produce call flushes: when it returns, every record is acknowledged and in the ledger, and
the partition's end offset counts it. Transactions end with a control batch (the commit or abort
marker), which takes an offset of its own: the ledger holds records, never markers.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Message, Producer

from resources.kafka import KafkaResource
from tests.support.dev_stack import wait_for

Coordinates = tuple[str, int, int]


@dataclass(frozen=True)
class LedgerEntry:
    """One record as the broker acknowledged it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    committed: bool = True

    @property
    def coordinates(self) -> Coordinates:
        """(topic, partition, offset)."""
        return (self.topic, self.partition, self.offset)


@dataclass
class Ledger:
    """Every acknowledged record, in acknowledgement order."""

    entries: list[LedgerEntry] = field(default_factory=list)

    def committed(self, topic: str | None = None) -> set[Coordinates]:
        """Coordinates of visible records (non-transactional or in a committed transaction)."""
        return {e.coordinates for e in self.entries if e.committed and topic in (None, e.topic)}

    def aborted(self, topic: str | None = None) -> set[Coordinates]:
        """Coordinates of records of aborted transactions (must never land)."""
        return {e.coordinates for e in self.entries if not e.committed and topic in (None, e.topic)}

    def values(self) -> dict[Coordinates, bytes | None]:
        """Coordinates -> value of every committed record."""
        return {e.coordinates: e.value for e in self.entries if e.committed}


Record = tuple[bytes | None, bytes | None, int | None]  # key, value, partition (None = by key)


class LedgerProducer:
    """Produce records and append each acknowledged one to a :class:`Ledger`."""

    def __init__(self, kafka: KafkaResource, ledger: Ledger, **overrides: Any) -> None:
        self.kafka = kafka
        self.ledger = ledger
        # librdkafka logs through Python logging: a producer kept alive by a failed test's
        # traceback then does not print reconnect errors after the broker has stopped.
        logger = {"logger": logging.getLogger("tests.ledger_producer")}
        self._producer: Producer = kafka.get_producer(**{**logger, **overrides})
        self._partition_counts: dict[str, int] = {}
        self._transactions_ready = False

    def _partitions(self, topic: str) -> int:
        """``topic``'s partition count, once the broker lists its partitions: a topic created a
        moment ago can still be listed with an error and none (seen once in a full run)."""

        def listed() -> int:
            found = self._producer.list_topics(topic, timeout=10).topics.get(topic)
            return len(found.partitions) if found is not None and found.error is None else 0

        if topic not in self._partition_counts:
            what = f"the partitions of topic {topic!r} in the broker's metadata"
            self._partition_counts[topic] = wait_for(what, listed, 30, every_s=0.2)
        return self._partition_counts[topic]

    def _place(self, topic: str, records: Iterable[Record]) -> list[tuple[Any, Any, int]]:
        """Give every record a partition: its own, else crc32(key), else round robin."""
        count = self._partitions(topic)
        return [
            (
                key,
                value,
                partition
                if partition is not None
                else zlib.crc32(key) % count
                if key is not None
                else index % count,
            )
            for index, (key, value, partition) in enumerate(records)
        ]

    def _send(
        self,
        topic: str,
        records: Sequence[tuple[bytes | None, bytes | None, int]],
        committed: bool,
        pending: list[LedgerEntry],
    ) -> None:
        def on_delivery(error: Any, message: Message) -> None:
            if error is not None:
                raise KafkaException(error)
            _, timestamp = message.timestamp()
            pending.append(
                LedgerEntry(
                    topic,
                    int(message.partition() or 0),
                    int(message.offset() or 0),
                    message.key(),
                    message.value(),
                    timestamp,
                    committed,
                )
            )

        for key, value, partition in records:
            self._producer.produce(
                topic, value=value, key=key, partition=partition, on_delivery=on_delivery
            )

    def _flush(self) -> None:
        if self._producer.flush(30) != 0:
            raise TimeoutError("records still in flight after 30 s")

    def produce(self, topic: str, records: Iterable[Record]) -> list[LedgerEntry]:
        """Produce ``records`` (not transactional), wait for every acknowledgement; return their
        entries."""
        pending: list[LedgerEntry] = []
        self._send(topic, self._place(topic, records), True, pending)
        self._flush()
        self.ledger.entries.extend(pending)
        return pending

    @contextmanager
    def open_transaction(
        self, topic: str, records: Iterable[Record], commit: bool = True
    ) -> Iterator[list[LedgerEntry]]:
        """Produce ``records`` in a transaction left open for the ``with`` block, then commit
        (or abort) it; the entries reach the ledger once the transaction ends.

        Needs a producer made with ``transactional.id``; ``init_transactions`` is called once.
        """
        if not self._transactions_ready:
            self._producer.init_transactions(30)
            self._transactions_ready = True
        placed = self._place(topic, records)
        pending: list[LedgerEntry] = []
        self._producer.begin_transaction()
        self._send(topic, placed, commit, pending)
        self._flush()
        try:
            yield pending
        except BaseException:
            self._producer.abort_transaction(30)
            raise
        if commit:
            self._producer.commit_transaction(30)
        else:
            self._producer.abort_transaction(30)
        self.ledger.entries.extend(pending)

    def produce_transaction(
        self, topic: str, records: Iterable[Record], commit: bool = True
    ) -> list[LedgerEntry]:
        """Produce ``records`` in one transaction, committed or aborted (see
        :meth:`open_transaction`)."""
        with self.open_transaction(topic, records, commit) as pending:
            return pending
