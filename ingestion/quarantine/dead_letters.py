"""The optional dead-letter topic: a Kafka copy of quarantined records, exactly once for
``read_committed`` consumers.

The quarantine table is the exactly-once home of a bad record; Kafka Connect users also expect
a dead-letter topic. The copy is produced after the data commit and before the group mirror,
with Kafka Connect's context headers, so a consumer can tell where each letter came from.
Because the mirror only moves after the copy is out, a commit whose offsets are ahead of the
mirror may not have been copied yet.

Each commit's copy is one Kafka transaction of the pipeline's transactional id
(``kafka-iceberg-<pipeline>-dead-letters``): all its letters, or none. Before it counts what is
already in the topic, the copier initialises that id, which fences any earlier copier of the
pipeline (a run killed mid-copy, a concurrent run or operator action) and completes or aborts
its transaction. It then reads, with ``read_committed``, from the oldest pending commit's time
(less an hour for clocks) to each partition's end as it was when the count began (every record
counted: another producer's open transaction is waited for, not read past), collects the source
coordinates each pending commit's letters name (``__ingestion.commit.id`` and Kafka Connect's
topic, partition and offset headers), and sends only the letters not there. So on retry a
letter is never sent twice: a failed copy was aborted whole, a copy whose commit outcome was
unknown is found by the count, and a letter doubled by an older at-least-once copy is counted
once. A copier fenced between its count and its commit fails and sends nothing. A backward
reset re-reads records whose letters were delivered: it records which (:data:`DELIVERED`), and
their letters are not sent again, so a reader sees each bad source record once, as in the
quarantine table. A count that
makes no progress for its timeout refuses (an undercount would send copies twice) and the next
run counts again. ``read_uncommitted`` consumers also see aborted letters. The platform's
principal needs ``Write`` and ``Describe`` on the transactional id.

A topic that does not exist yet is created before the first copy (``ensure_dead_letter_topic``,
with the pipeline's ``dead_letter_topic_partitions`` and ``dead_letter_topic_replication_factor``,
as Kafka Connect creates its dead-letter queue); a broker that refuses names the pipeline, the
topic and the reason, and the mirror stays behind until a run can copy.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ingestion.exceptions import DeadLetterTopicError
from ingestion.kafka.clients import client_properties
from ingestion.kafka.consumer import consumer_config, open_consumer
from ingestion.table.offsets import (
    CLUSTER_ID,
    COMMIT_ID,
    FAILOVER_TO,
    GROUP_OFFSETS_BEFORE,
    OFFSETS_PREFIX,
    QUARANTINED,
    RESET_BY,
    decode_offsets,
    decode_positions,
    flatten,
    iter_ancestry,
    snapshot_properties,
)

if TYPE_CHECKING:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from ingestion.kafka.ranges import Key
    from ingestion.spec.pipeline import PipelineSpec

HEADERS = {  # quarantine column -> Kafka Connect's dead-letter context header
    "_kafka_topic": "__connect.errors.topic",
    "_kafka_partition": "__connect.errors.partition",
    "_kafka_offset": "__connect.errors.offset",
    "error_class": "__connect.errors.exception.class.name",
    "error_message": "__connect.errors.exception.message",
    "commit_id": "__ingestion.commit.id",
}
COMMIT_HEADER = HEADERS["commit_id"]
TRANSACTIONAL_ID = "kafka-iceberg-{pipeline}-dead-letters"
"""The transactional id of a pipeline's dead-letter copies (fences an earlier copier)."""
DELIVERED = "kafka.dead-letters.delivered"
"""Table property: ``{"cluster": id, "topics": {name: {"id": topic id, "partitions":
{partition: [offset, ...]}}}}``, the source records whose letters a backward reset found in the
topic when it cut their quarantine rows to re-read them (:func:`mark_delivered`). The re-read
quarantines them again under new commits; their letters are not sent again, so a
``read_committed`` reader sees each bad source record once, as the quarantine table holds it
once. Only letters the reset found (by their source coordinates) are listed: a record the re-read
quarantines for the first time, or whose letter never reached this topic, is sent. A table
property: it outlives snapshot expiry while a long re-read is copied over many runs."""
MAX_DELIVERED_BYTES = 100_000
"""The property's size at most (every commit rewrites the table metadata holding it, and some
catalogs cap a property's value, Glue at 512,000 bytes); past it, the re-read letters of the
partitions left out are sent a second time, and the reset says so."""


@dataclass(frozen=True)
class PendingCopy:
    """A commit with dead letters whose offsets are ahead of the Kafka group mirror."""

    commit_id: str
    committed_at_ms: int
    records: int
    cluster_id: str = ""  # the cluster the commit read (its letters' coordinates are there)
    topic_ids: dict[str, str] = field(default_factory=dict)  # its topics' ids, by name


def unpublished_commits(
    table: Table, group_id: str, mirrored: dict[tuple[str, int], int]
) -> list[PendingCopy]:
    """Commits with dead letters whose offsets are ahead of the mirror (newest first), back to
    the newest switch to another cluster at most: the commits before it read the cluster it
    left, whose dead-letter topic the switch copied their letters to first
    (``platform_assets.dr.failover.copy_owed_dead_letters``); a group there lacks their topics,
    which would make every older commit look owed.

    A group still where the newest operator action found it (its recorded
    ``kafka.group-offsets-before``) on a partition that action moved back (its move of the group
    failed) stands for that action's offsets there: the commits since re-read the range, and
    before, such a group hid them, so the letters of records read there for the first time
    were never copied."""
    key = OFFSETS_PREFIX + group_id
    mirrored = effective_mirror(table, key, mirrored)
    pending = []
    for snapshot in iter_ancestry(table):
        properties = snapshot_properties(snapshot)
        if FAILOVER_TO in properties:
            break
        if key not in properties:
            continue
        decoded = decode_offsets(properties[key])
        offsets = flatten(decoded)
        if all(offset <= mirrored.get(tp, -1) for tp, offset in offsets.items()):
            break  # this commit and every older one were mirrored, hence copied
        if int(properties.get(QUARANTINED, "0")) > 0:
            pending.append(
                PendingCopy(
                    properties[COMMIT_ID],
                    snapshot.timestamp_ms,
                    int(properties[QUARANTINED]),
                    properties.get(CLUSTER_ID, ""),
                    {topic: topic_offsets.topic_id for topic, topic_offsets in decoded.items()},
                )
            )
    return pending


def effective_mirror(
    table: Table, key: str, mirrored: dict[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    """``mirrored``, with each partition where the group still sits where the newest operator
    action of the group (back to the newest switch) found it and moved it back from replaced
    by that action's offset: the action copied what was owed, then failed to move the group.
    A group ahead for any other reason (a foreign move) is taken as it is."""
    for snapshot in iter_ancestry(table):
        properties = snapshot_properties(snapshot)
        if FAILOVER_TO in properties:
            return mirrored
        if key not in properties or RESET_BY not in properties:
            continue
        found = decode_positions(properties.get(GROUP_OFFSETS_BEFORE, "{}"))
        moved = flatten(decode_offsets(properties[key]))
        stale = {
            tp: offset
            for tp, offset in moved.items()
            if tp in found and mirrored.get(tp) == found[tp] and found[tp] > offset
        }
        return {**mirrored, **stale}
    return mirrored


@dataclass(frozen=True)
class Delivered:
    """The :data:`DELIVERED` offsets of one cluster: per (topic, partition), with each topic's
    id (empty: none)."""

    cluster_id: str = ""
    topic_ids: dict[str, str] = field(default_factory=dict)
    offsets: dict[Key, frozenset[int]] = field(default_factory=dict)
    dead_letter_topic: str = ""  # "name:topic id" of the topic the letters were found in

    def holds(self, pending: PendingCopy, row: dict[str, Any]) -> bool:
        """Whether the quarantined ``row`` of ``pending``'s commit had its letter delivered
        before a backward reset re-read it (same cluster, same topic id, offset listed)."""
        topic = str(row["_kafka_topic"])
        if pending.cluster_id != self.cluster_id or self.topic_ids.get(topic) is None:
            return False
        if pending.topic_ids.get(topic) != self.topic_ids[topic]:
            return False  # the topic was recreated since: its records are new
        return int(row["_kafka_offset"]) in self.offsets.get(
            (topic, int(row["_kafka_partition"])), ()
        )

    def encode(self) -> str:
        """The property's value."""
        topics: dict[str, dict[str, Any]] = {}
        for (topic, partition), offsets in sorted(self.offsets.items()):
            if offsets:
                entry = topics.setdefault(topic, {"id": self.topic_ids[topic], "partitions": {}})
                entry["partitions"][str(partition)] = sorted(offsets)
        document = {"cluster": self.cluster_id, "dead_letter_topic": self.dead_letter_topic}
        return orjson.dumps({**document, "topics": topics}).decode()

    def for_topic(self, dead_letter_topic: str) -> Delivered:
        """These offsets if they were found in ``dead_letter_topic`` (``name:topic id``), else
        none: a renamed, or deleted and recreated, dead-letter topic lacks those letters."""
        return self if dead_letter_topic == self.dead_letter_topic else Delivered()


def read_delivered(table: Table) -> Delivered:
    """The table's :data:`DELIVERED` property (empty when unset).

    Raises:
        DeadLetterTopicError: the value cannot be read (edited by hand): it names the property
            and the fix, rather than guess (a guess could skip a letter for good).
    """
    text = table.properties.get(DELIVERED)
    if not text:
        return Delivered()
    try:
        document = orjson.loads(text)
        topics = document["topics"]
        return Delivered(
            str(document["cluster"]),
            {topic: str(entry["id"]) for topic, entry in topics.items()},
            {
                (topic, int(partition)): frozenset(int(o) for o in offsets)
                for topic, entry in topics.items()
                for partition, offsets in entry["partitions"].items()
            },
            str(document["dead_letter_topic"]),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DeadLetterTopicError(
            f"table {table.name()!r}: property {DELIVERED!r} cannot be read ({exc!r}); it lists "
            "the letters a backward reset re-reads that were delivered already. Unset it (the "
            "letters of the records being re-read are then sent a second time) and retry"
        ) from exc


def mark_delivered(
    table: Table,
    quarantine: Table,
    kafka_config: dict[str, Any],
    spec: PipelineSpec,
    cluster_id: str,
    before: dict[Key, int],
    topic_ids: dict[str, str],
    rewound_filter: str,
    group: dict[Key, int],
    dead_letter_topic: str,
) -> tuple[dict[str, str], list[str]]:
    """The :data:`DELIVERED` property a backward reset sets with its commit, after its own copy
    of what was owed, and lines for the operator.

    Listed: the quarantine rows it cuts (``rewound_filter``) of the topics in ``topic_ids``
    (those read on this cluster under the same topic id as the committed offsets) whose letters
    it finds in the dead-letter topic now, by source coordinates under any commit id (a re-read
    letter it skipped earlier carries its first commit's id); read from an hour before the
    oldest such record's timestamp, in ``dead_letter_topic`` (``name:topic id``, recorded:
    another topic lacks them). Kept from an earlier list of the same topic: the offsets the table
    has not read again since (at or past ``before``, the table's offsets now, or with no
    quarantine row yet: a forward reset skipped them), and those read again by a commit the
    Kafka group (``group``) has not passed yet (its copy is still to come). A count that fails,
    or that would list more than :data:`MAX_DELIVERED_BYTES`, lists nothing new (their letters
    may go out again; a line says so) and never blocks the reset.
    """
    topic = spec.dead_letter_topic
    assert topic is not None
    rows = (
        quarantine.scan(
            row_filter=rewound_filter,
            selected_fields=(
                "_kafka_topic",
                "_kafka_partition",
                "_kafka_offset",
                "_kafka_timestamp",
            ),
        )
        .to_arrow()
        .to_pylist()
    )
    rows = [row for row in rows if row["_kafka_topic"] in topic_ids]
    notes: list[str] = []
    found: set[Coordinates] = set()
    if sum(len(str(row["_kafka_offset"])) + 1 for row in rows) > MAX_DELIVERED_BYTES:
        notes.append(
            f"the letters of {len(rows)} re-read record(s) will be sent to the dead-letter topic "
            f"a second time (more than {MAX_DELIVERED_BYTES:,} bytes to record in {DELIVERED!r})"
        )
        rows = []
    if rows:
        stamps = [row["_kafka_timestamp"] for row in rows]
        oldest = min((int(s.timestamp() * 1000) for s in stamps if s is not None), default=0)
        if any(s is None for s in stamps):
            oldest = 0
        try:
            wanted = {row_coordinates(row) for row in rows}
            count_copies(
                kafka_config,
                topic,
                [PendingCopy("", oldest, len(rows))],
                spec.name,
                anywhere=found,
                wanted=wanted,
            )

        except Exception as exc:  # never block the reset on it: at worst letters go out twice
            notes.append(
                f"the dead-letter topic {topic!r} could not be read to list the letters this "
                f"reset re-reads ({exc}): the letters of {len(rows)} re-read record(s) may be "
                "sent a second time"
            )
    listed: dict[Key, set[int]] = {}
    for row in rows:
        if row_coordinates(row) in found:
            key = (row["_kafka_topic"], int(row["_kafka_partition"]))
            listed.setdefault(key, set()).add(int(row["_kafka_offset"]))
    earlier = read_delivered(table).for_topic(dead_letter_topic)
    if earlier.cluster_id == cluster_id:
        carried = {
            key: offsets
            for key, offsets in earlier.offsets.items()
            if earlier.topic_ids.get(key[0]) == topic_ids.get(key[0])
        }
        requoted = quarantined_offsets(quarantine, carried, before)
        for key, offsets in carried.items():
            # Read again by a commit the group has passed: its copy skipped them for good.
            passed = group.get(key, -1) >= before.get(key, 0)
            again = requoted.get(key, set()) if passed else set()
            for offset in offsets:
                if offset >= before.get(key, 0) or offset not in again:
                    listed.setdefault(key, set()).add(offset)
    size = 0
    for key in sorted(listed):
        size += sum(len(str(o)) + 1 for o in listed[key]) + len(key[0]) + 40
        if size > MAX_DELIVERED_BYTES:
            notes.append(
                f"{key[0]}[{key[1]}]: the letters of {len(listed[key])} re-read record(s) will be "
                f"sent to the dead-letter topic a second time (more than {MAX_DELIVERED_BYTES:,} "
                f"bytes to record in {DELIVERED!r})"
            )
            listed[key] = set()
    marks = Delivered(
        cluster_id,
        {t: topic_ids[t] for t, _ in listed if t in topic_ids},
        {k: frozenset(v) for k, v in listed.items() if v and k[0] in topic_ids},
        dead_letter_topic,
    )
    if not marks.offsets and DELIVERED not in table.properties:
        return {}, notes
    return {DELIVERED: marks.encode()}, notes


def quarantined_offsets(
    quarantine: Table, listed: dict[Key, frozenset[int]], before: dict[Key, int]
) -> dict[Key, set[int]]:
    """Of the ``listed`` offsets below the table's offsets (``before``), those the quarantine
    table holds a row for again (read again since an earlier reset listed them)."""
    clauses = []
    for (topic, partition), offsets in sorted(listed.items()):
        below = sorted(o for o in offsets if o < before.get((topic, partition), 0))
        if below:
            clauses.append(
                f"(_kafka_topic = '{topic}' and _kafka_partition = {partition} and "
                f"_kafka_offset in ({', '.join(map(str, below))}))"
            )
    if not clauses:
        return {}
    rows = (
        quarantine.scan(
            row_filter=" or ".join(clauses),
            selected_fields=("_kafka_topic", "_kafka_partition", "_kafka_offset"),
        )
        .to_arrow()
        .to_pylist()
    )
    held: dict[Key, set[int]] = {}
    for row in rows:
        held.setdefault((row["_kafka_topic"], row["_kafka_partition"]), set()).add(
            row["_kafka_offset"]
        )
    return held


def dead_letter_topic_identity(admin: AdminClient, topic: str, timeout_s: float = 10.0) -> str:
    """``name:topic id`` of the dead-letter topic ("" when it cannot be described: then no
    letter is taken as delivered, at worst one goes out twice)."""
    from confluent_kafka import KafkaException, TopicCollection

    try:
        description = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout_s)
    except (KafkaException, TimeoutError):
        return ""
    return f"{topic}:{description.topic_id}"


def dead_letter_topic_partitions(
    admin: AdminClient, topic: str, timeout_s: float = 10.0
) -> int | None:
    """The topic's partition count, None when it does not exist (describe: never creates it)."""
    from confluent_kafka import KafkaException, TopicCollection

    try:
        described = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout_s)
    except KafkaException as exc:
        if exc.args[0].name() == "UNKNOWN_TOPIC_OR_PART":
            return None
        raise
    return len(described.partitions)


def create_topic_refusal(
    admin: AdminClient, spec: PipelineSpec, timeout_s: float = 10.0, *, validate_only: bool
) -> str | None:
    """Ask the broker to create the spec's dead-letter topic (``validate_only``: only whether
    it would); return why it refused, None when it created (or would create) it. A topic created
    meanwhile by someone else is not a refusal."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    assert spec.dead_letter_topic is not None
    new = NewTopic(
        spec.dead_letter_topic,
        num_partitions=spec.dead_letter_topic_partitions,
        replication_factor=spec.dead_letter_topic_replication_factor,
    )
    future = admin.create_topics(
        [new], operation_timeout=timeout_s, request_timeout=timeout_s, validate_only=validate_only
    )[spec.dead_letter_topic]
    try:
        future.result(timeout_s + 5)
    except KafkaException as exc:
        error = exc.args[0]
        return None if error.name() == "TOPIC_ALREADY_EXISTS" else str(error)
    except Exception as exc:  # a timeout: the broker is unreachable
        return f"{type(exc).__name__}: {exc}"
    return None


def ensure_dead_letter_topic(
    admin: AdminClient, spec: PipelineSpec, timeout_s: float = 30.0
) -> bool:
    """Create the spec's dead-letter topic when it does not exist and wait until its partitions
    are visible; return whether this call created it.

    Raises:
        DeadLetterTopicError: the broker refused to create it (no CREATE permission on the
            topic or cluster, a replication factor above the brokers, a policy), naming the
            pipeline, the topic and the reason.
    """
    topic = spec.dead_letter_topic
    assert topic is not None
    if dead_letter_topic_partitions(admin, topic) is not None:
        return False
    refusal = create_topic_refusal(admin, spec, timeout_s, validate_only=False)
    if refusal is not None:
        raise DeadLetterTopicError(creation_refused(spec, refusal))
    deadline = time.monotonic() + timeout_s
    while not dead_letter_topic_partitions(admin, topic):  # creation is asynchronous
        if time.monotonic() > deadline:
            raise DeadLetterTopicError(
                f"pipeline {spec.name!r}: dead-letter topic {topic!r} was created but its "
                f"partitions did not show within {timeout_s:g} s"
            )
        time.sleep(0.2)
    return True


def creation_refused(spec: PipelineSpec, reason: str) -> str:
    """The message of a refused creation of the spec's dead-letter topic: what, why, the fix."""
    return (
        f"pipeline {spec.name!r}: dead-letter topic {spec.dead_letter_topic!r} does not exist and "
        f"the broker refused to create it ({reason}). Create it yourself (partitions "
        f"{spec.dead_letter_topic_partitions}, replication factor "
        f"{spec.dead_letter_topic_replication_factor}; -1: the broker's default), or grant the "
        "platform's principal CREATE on it, or fix dead_letter_topic_partitions / "
        "dead_letter_topic_replication_factor"
    )


Coordinates = tuple[bytes, bytes, bytes]
"""A letter's source record as its headers name it: topic, partition, offset."""

CLOCK_MARGIN_MS = 3_600_000
"""The count reads from an hour before the oldest pending commit: a letter is stamped by its
copier's clock (or the broker's, ``LogAppendTime``), which may run behind the committer's. Only
extra reading: the count is by commit id."""

FENCED_ATTEMPTS = 3
"""Copies a copier starts over when another copier of the pipeline fenced it (1 s, 2 s apart)."""

TRANSACTION_TIMEOUT_MS = 60_000
"""The copy's ``transaction.timeout.ms`` (Kafka's default), set explicitly: librdkafka refuses a
``message.timeout.ms``, ``delivery.timeout.ms`` or ``socket.timeout.ms`` above it, so those of
the shared client settings are clamped for this producer."""


def count_copies(
    kafka_config: dict[str, Any],
    topic: str,
    pending: list[PendingCopy],
    pipeline: str,
    timeout_s: float = 30.0,
    anywhere: set[Coordinates] | None = None,
    wanted: set[Coordinates] | None = None,
) -> dict[str, set[Coordinates]]:
    """The letters of each pending commit already in ``topic``: the source coordinates their
    headers name, per commit id; read from the oldest pending commit's time (less
    :data:`CLOCK_MARGIN_MS`) to each partition's end as it is now, every record included
    (``read_uncommitted`` watermark), through a ``read_committed`` consumer: aborted copies
    are not counted, and another producer's open transaction is waited for, not read past.
    With ``anywhere``, also collects into it the source coordinates of every letter (of those
    in ``wanted``, when given), whatever its commit id. Joins no group, commits nothing.

    Raises:
        DeadLetterTopicError: the topic has no partitions, the broker answered a partition with
            an error, or the read made no progress for ``timeout_s`` (an undercount would send
            copies twice: nothing is sent, the mirror stays behind and a later run counts
            again).
    """
    from confluent_kafka import Consumer, TopicPartition

    if not pending:
        return {}
    since = max(0, min(p.committed_at_ms for p in pending) - CLOCK_MARGIN_MS)
    found: dict[str, set[Coordinates]] = {p.commit_id: set() for p in pending}
    where = f"pipeline {pipeline!r}: dead-letter topic {topic!r}"
    with open_consumer(kafka_config, f"{pipeline}-dead-letter-count") as consumer:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if metadata.error is not None or not metadata.partitions:
            # An empty query fails with _INVALID_ARG; counting nothing would send every copy
            # again: refuse, so the mirror stays behind and a later run counts again.
            raise DeadLetterTopicError(
                f"dead-letter topic {topic!r} has no partitions to count copies in "
                f"({metadata.error or 'it does not exist'})"
            )
        query = [TopicPartition(topic, p, since) for p in sorted(metadata.partitions)]
        # Every record, committed or not: read_committed answers stop at the last stable offset,
        # so another producer's open transaction would hide letters committed after it.
        everything = Consumer(
            {
                **consumer_config(kafka_config, f"{pipeline}-dead-letter-ends"),
                "isolation.level": "read_uncommitted",
            }
        )
        try:
            starts = everything.offsets_for_times(query, timeout=timeout_s)
            failed = [s for s in starts if s.error is not None]
            if failed:
                raise DeadLetterTopicError(
                    f"{where}: the broker could not say where to count copies from "
                    f"({', '.join(f'[{s.partition}]: {s.error}' for s in failed)}); nothing was "
                    "sent, the next run counts again"
                )
            starts = [s for s in starts if s.offset >= 0]  # -1: nothing since
            ends = {
                s.partition: everything.get_watermark_offsets(s, timeout=timeout_s, cached=False)[1]
                for s in starts
            }
        finally:
            everything.close()
        unread = [s for s in starts if s.offset < ends[s.partition]]
        consumer.assign(unread)
        last_progress, behind = time.monotonic(), sum(ends[s.partition] - s.offset for s in unread)
        while unread:
            for message in consumer.consume(num_messages=1000, timeout=1.0):
                if message.error() is not None:
                    continue
                headers = dict(message.headers() or [])
                value = headers.get(COMMIT_HEADER)
                commit = value.decode() if isinstance(value, bytes) else value
                if commit in found:
                    found[commit].add(coordinates(headers))
                if anywhere is not None:  # a wanted letter's source, whichever commit sent it
                    source = coordinates(headers)
                    if wanted is None or source in wanted:
                        anywhere.add(source)
            # The position, not the last record: a transaction marker ends many partitions.
            positions = consumer.position(unread)
            unread = [s for s in positions if s.offset < ends[s.partition]]
            left = sum(ends[s.partition] - max(s.offset, 0) for s in unread)
            if left < behind:
                last_progress, behind = time.monotonic(), left
            elif time.monotonic() - last_progress > timeout_s:
                stuck = ", ".join(f"[{s.partition}] at {s.offset}" for s in unread)
                raise DeadLetterTopicError(
                    f"{where}: counting the copies already sent made no progress for "
                    f"{timeout_s:g} s ({stuck}; another producer's open transaction, or the "
                    "broker); nothing was sent, the next run counts again"
                )
    return found


def row_coordinates(row: dict[str, Any]) -> Coordinates:
    """A quarantine row's source coordinates, as its letter's headers spell them."""
    topic, partition, offset = (
        row[c] for c in ("_kafka_topic", "_kafka_partition", "_kafka_offset")
    )
    return str(topic).encode(), str(partition).encode(), str(offset).encode()


def coordinates(headers: dict[str, Any]) -> Coordinates:
    """A letter's source coordinates from its Kafka Connect context headers."""
    return (
        headers.get(HEADERS["_kafka_topic"]) or b"",
        headers.get(HEADERS["_kafka_partition"]) or b"",
        headers.get(HEADERS["_kafka_offset"]) or b"",
    )


def dead_letter_producer(
    kafka_config: dict[str, Any], pipeline: str, timeout_s: float = 30.0
) -> Producer:
    """The pipeline's transactional dead-letter producer, initialised: an earlier producer of
    the pipeline's letters is fenced, and its open transaction aborted (a committing one
    completed), so what :func:`count_copies` reads next is final.

    Raises:
        DeadLetterTopicError: the transactional id could not be initialised (its ACLs, a broker
            without transactions or with too few brokers for ``__transaction_state``, or no
            broker answered); the message names the id and what the principal needs.
    """
    from confluent_kafka import KafkaException, Producer

    config = client_properties(kafka_config, "producer")
    for key in ("message.timeout.ms", "delivery.timeout.ms", "socket.timeout.ms"):
        if key in config:
            config[key] = min(int(config[key]), TRANSACTION_TIMEOUT_MS)
    producer = Producer(
        {
            **config,
            "transactional.id": TRANSACTIONAL_ID.format(pipeline=pipeline),
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    try:
        producer.init_transactions(timeout_s)
    except KafkaException as exc:
        transactional_id = TRANSACTIONAL_ID.format(pipeline=pipeline)
        raise DeadLetterTopicError(
            f"pipeline {pipeline!r}: the dead-letter copier could not initialise its "
            f"transactional id {transactional_id!r} ({exc.args[0]}): the platform's principal "
            "needs Write and Describe on that transactional id (docs/production.md), and the "
            "brokers must answer and allow transactions (enough brokers for "
            "transaction.state.log.replication.factor); nothing was sent"
        ) from exc
    return producer


def publish_dead_letters(
    producer: Producer,
    topic: str,
    quarantine: Table,
    commit_ids: list[str],
    present: dict[str, set[Coordinates]] | None = None,
    timeout_s: float = 30.0,
    delivered: Delivered | None = None,
    pending: dict[str, PendingCopy] | None = None,
) -> int:
    """Produce the quarantined records of ``commit_ids`` to ``topic``, one transaction of
    ``producer`` (:func:`dead_letter_producer`) per commit, skipping the letters ``present``
    already holds (by their source coordinates) and those a backward reset re-read after they
    were delivered (``delivered``, the :data:`DELIVERED` offsets, against the cluster and topic
    ids of each commit: ``pending``, by commit id); return how many were sent.

    Delivery: each commit's letters all or none for ``read_committed`` consumers; on any
    failure the open transaction is aborted (or, if the broker cannot be reached, left to the
    coordinator's timeout and the next copier's fencing); the commits before it stay sent.

    Raises:
        KafkaException: a record was not acknowledged or a commit failed (the mirror then
            stays behind, so the next run counts and copies again).
    """
    from confluent_kafka import KafkaException

    if not commit_ids:
        return 0
    delivered = delivered or Delivered()
    listed = ", ".join(f"'{commit_id}'" for commit_id in commit_ids)  # hex ids: safe to quote
    rows = quarantine.scan(row_filter=f"commit_id IN ({listed})").to_arrow().to_pylist()
    by_commit: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_commit.setdefault(row["commit_id"], []).append(row)
    sent = 0
    for commit_id in commit_ids:
        there = (present or {}).get(commit_id, set())
        copy = (pending or {}).get(commit_id, PendingCopy(commit_id, 0, 0))
        letters = []
        for row in by_commit.get(commit_id, []):
            headers = [(name, str(row[column]).encode()) for column, name in HEADERS.items()]
            if coordinates(dict(headers)) not in there and not delivered.holds(copy, row):
                letters.append((row, headers))
        if not letters:
            continue
        producer.begin_transaction()
        try:
            for row, headers in letters:
                produce(producer, topic, row, headers)
            producer.commit_transaction(timeout_s)  # flushes: fails if any record failed
        except Exception:
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(timeout_s)
            raise
        sent += len(letters)
    return sent


def produce(producer: Producer, topic: str, row: dict[str, Any], headers: list[Any]) -> None:
    """One letter; while the producer's queue is full, wait for deliveries and try again."""
    while True:
        try:
            producer.produce(topic, key=row["_kafka_key"], value=row["value"], headers=headers)
        except BufferError:
            producer.poll(1.0)
        else:
            producer.poll(0)
            return


@dataclass(frozen=True)
class DeadLetterCopy:
    """What :func:`copy_pending_dead_letters` did: records produced, and whether it created
    the topic."""

    copies: int = 0
    created_topic: bool = False


def is_fenced(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a copier's fencing by another copier of the pipeline (a run's and an
    operator action's at once)."""
    from confluent_kafka import KafkaError, KafkaException

    codes = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
    return isinstance(exc, KafkaException) and exc.args[0].code() in codes


def copy_pending_dead_letters(
    catalog: Catalog,
    spec: PipelineSpec,
    table: Table,
    admin: AdminClient,
    kafka_config: dict[str, Any],
) -> DeadLetterCopy:
    """Copy to the spec's dead-letter topic the letters of every commit of ``table`` ahead of
    the group's mirror whose copies are not all in the topic yet (the quarantine table must be
    synced first). Runs call it before they move the group; so do the operator actions that
    move it (reset, migration), since a commit the group has passed is never searched again.

    Delivery: exactly once for ``read_committed`` consumers (see the module docstring): each
    commit's missing letters are one transaction, after a count that fencing made final. A
    copier fenced by another one (a run and an operator action at once) counts again and
    copies what is still missing, up to :data:`FENCED_ATTEMPTS` times.

    Raises:
        DeadLetterTopicError, KafkaException: the topic cannot be created or a record was not
            acknowledged; the group must then stay where it is.
    """
    from confluent_kafka import KafkaException

    from ingestion.pipeline.mirror import read_group_offsets

    topic = spec.dead_letter_topic
    if topic is None or not catalog.table_exists(spec.quarantine_table):
        return DeadLetterCopy()
    group = spec.consumer_group_id
    pending = unpublished_commits(table, group, read_group_offsets(admin, group))
    if not pending:
        return DeadLetterCopy()
    created = ensure_dead_letter_topic(admin, spec)
    quarantine = catalog.load_table(spec.quarantine_table)
    delivered = read_delivered(table)
    if delivered.offsets:
        delivered = delivered.for_topic(dead_letter_topic_identity(admin, topic))
    by_id = {p.commit_id: p for p in pending}
    for attempt in range(1, FENCED_ATTEMPTS + 1):
        try:
            producer = dead_letter_producer(kafka_config, spec.name)  # fences earlier copiers
            present = count_copies(kafka_config, topic, pending, spec.name)
            owed = [p.commit_id for p in pending if len(present[p.commit_id]) < p.records]
            copies = publish_dead_letters(
                producer, topic, quarantine, owed, present, delivered=delivered, pending=by_id
            )
        except KafkaException as exc:
            # Fenced: another copier of this pipeline (a run, an action) started meanwhile. What
            # this one committed stands; count again after it, as a fresh copier.
            if not is_fenced(exc) or attempt == FENCED_ATTEMPTS:
                raise
            time.sleep(attempt)
        else:
            return DeadLetterCopy(copies, created)
    raise AssertionError("unreachable")
