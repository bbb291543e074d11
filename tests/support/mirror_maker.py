"""Apache Kafka's MirrorMaker 2 in dedicated mode between two embedded brokers: one flow each.

:class:`MirrorMaker` writes an ``mm2.properties`` for one flow ``source -> target`` (both
clusters under their MM2 aliases, the flow's topics and groups, ``replication.policy.class``
default or Identity) and runs ``org.apache.kafka.connect.mirror.MirrorMaker`` on it, with the
class path of ``resources/jvm/mirror-maker/pom.xml`` (:func:`resources.jvm.class_path`), like the
broker: its own process group, one log file, a bounded heap, nothing left running after
:meth:`~resources.process.ManagedProcess.stop`. Its connectors run as MM2 ships them; only the
intervals are short (checkpoints, group and topic refreshes, offset commits every second), so a
test waits seconds, not minutes, for what MM2 does anyway.

The waits read what MM2 wrote: :meth:`MirrorMaker.wait_mirrored` reads the source offsets MM2's
source task committed (``mm2-offsets.<source alias>.internal`` on the target, Kafka Connect's
offsets topic: ``{"offset": n}`` is the last source record whose copy the target acknowledged),
so it holds only once the source's last record is copied, however many records producers wrote
into the copy topic themselves; :meth:`MirrorMaker.wait_checkpoint` reads
``<source alias>.checkpoints.internal`` with the platform's own reader
(:func:`ingestion.dr.replica_check.read_checkpoints`, MirrorClient's ``RemoteClusterUtils``
semantics: the newest checkpoint per group and replica partition).

Its start time and resident set, and every way real MM2 behaved differently from the stand-in
(``tests/support/mm2_standin.py``): docs/disaster-recovery.md, "Verified on real MirrorMaker 2".
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from ingestion.dr.mm2 import Checkpoint, checkpoints_topic, offset_syncs_topic, replica_topic
from ingestion.dr.replica_check import newest_checkpoints, read_checkpoints
from ingestion.kafka.consumer import iter_range, open_consumer
from ingestion.kafka.ranges import OffsetRange
from resources.jvm import LOG4J2_CONFIG, class_path, java_binary
from resources.process import ManagedProcess

MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"
IDENTITY = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"
DEFAULT = "org.apache.kafka.connect.mirror.DefaultReplicationPolicy"
STARTED = "Kafka MirrorMaker started"


class MirrorMakerError(RuntimeError):
    """MirrorMaker 2 did not start, or did not mirror what a test waited for."""


class MirrorMaker(ManagedProcess):
    """One MM2 flow ``source_alias -> target_alias`` in dedicated mode, as a context manager.

    ``clusters`` maps both aliases to bootstrap servers. ``topics`` and ``groups`` are names
    (escaped into MM2's regex lists). ``identity`` selects ``IdentityReplicationPolicy``;
    otherwise MM2's default policy names copies ``<source alias>.<topic>``. ``config`` adds or
    overrides properties (e.g. ``offset.lag.max``).
    """

    def __init__(
        self,
        log_path: str | Path,
        clusters: dict[str, str],
        source_alias: str,
        target_alias: str,
        topics: list[str],
        groups: list[str],
        *,
        identity: bool = False,
        sync_group_offsets: bool = False,
        offset_lag_max: int = 100,
        heap_mb: int = 256,
        start_timeout_s: float = 120.0,
        stop_timeout_s: float = 20.0,
        config: dict[str, str] | None = None,
    ) -> None:
        self.log_path = Path(log_path)
        self.clusters = dict(clusters)
        self.source_alias, self.target_alias = source_alias, target_alias
        self.topics, self.groups = list(topics), list(groups)
        self.identity = identity
        self.sync_group_offsets = sync_group_offsets
        self.offset_lag_max = offset_lag_max
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.extra_config = dict(config or {})
        self.started_s: float | None = None  # seconds from spawn to a running flow
        self._marks: dict[tuple[str, int], int] = {}  # source offsets the last waits reached

    # -- naming, as MM2 names things ------------------------------------------------------

    @property
    def source(self) -> str:
        """The source cluster's bootstrap servers."""
        return self.clusters[self.source_alias]

    @property
    def target(self) -> str:
        """The target cluster's bootstrap servers."""
        return self.clusters[self.target_alias]

    def remote(self, topic: str) -> str:
        """MM2's name on the target for the source's ``topic``."""
        return replica_topic(topic, self.source_alias, "identity" if self.identity else "default")

    @property
    def checkpoints_topic(self) -> str:
        """``<source alias>.checkpoints.internal`` on the target."""
        return checkpoints_topic(self.source_alias)

    def create_checkpoints_topic(self, partitions: int, config: dict[str, str]) -> None:
        """Create the checkpoints topic on the target before MM2 starts (MM2 then uses it as it
        is): the replica check's tests give it a wrong shape."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.target})
        made = admin.create_topics([NewTopic(self.checkpoints_topic, partitions, 1, config=config)])
        made[self.checkpoints_topic].result(10)

    @property
    def syncs_topic(self) -> str:
        """``mm2-offset-syncs.<target alias>.internal`` on the source."""
        return offset_syncs_topic(self.target_alias)

    # -- process ----------------------------------------------------------------------------

    def properties(self) -> dict[str, str]:
        """The ``mm2.properties`` of this flow."""
        flow = f"{self.source_alias}->{self.target_alias}"
        back = f"{self.target_alias}->{self.source_alias}"
        config = {
            "clusters": f"{self.source_alias}, {self.target_alias}",
            f"{self.source_alias}.bootstrap.servers": self.source,
            f"{self.target_alias}.bootstrap.servers": self.target,
            f"{flow}.enabled": "true",
            f"{back}.enabled": "false",
            f"{flow}.topics": ",".join(re.escape(t) for t in self.topics) or "^$",
            f"{flow}.groups": ",".join(re.escape(g) for g in self.groups) or "^$",
            "replication.policy.class": IDENTITY if self.identity else DEFAULT,
            # One broker per cluster: every topic MM2 creates has one replica.
            "replication.factor": "1",
            "checkpoints.topic.replication.factor": "1",
            "heartbeats.topic.replication.factor": "1",
            "offset-syncs.topic.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "config.storage.replication.factor": "1",
            # Seconds instead of minutes; otherwise MM2's defaults.
            "emit.checkpoints.interval.seconds": "1",
            "sync.group.offsets.enabled": str(self.sync_group_offsets).lower(),
            "sync.group.offsets.interval.seconds": "1",
            "refresh.topics.interval.seconds": "1",
            "refresh.groups.interval.seconds": "1",
            "offset.flush.interval.ms": "1000",
            "offset.lag.max": str(self.offset_lag_max),
            # Heartbeats would add a heartbeats topic per cluster and start a herder for the
            # disabled way back; ACL sync needs an authorizer the embedded brokers lack.
            "emit.heartbeats.enabled": "false",
            "sync.topic.acls.enabled": "false",
        }
        return config | self.extra_config

    def start(self) -> Self:
        """Write the properties, start MM2 and wait until its flow runs (bounded): its
        'started' line, then the checkpoints topic and the copy of each mirrored topic that
        exists on the source, which its connectors create once the worker leads its group."""
        cp = class_path("mirror-maker")
        props = self.log_path.with_suffix(".properties")
        props.parent.mkdir(parents=True, exist_ok=True)
        props.write_text("".join(f"{k} = {v}\n" for k, v in self.properties().items()))
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        spawned = time.monotonic()
        process = self.spawn(
            [
                java_binary(),
                f"-Xmx{self.heap_mb}m",
                "-Xms32m",
                "-XX:+UseSerialGC",  # one GC thread: 2 cores and many servers
                "-XX:TieredStopAtLevel=1",  # C1 only: a faster start, a smaller code cache
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
                "-cp",
                cp,
                MAIN,
                str(props),
            ]
        )
        deadline = spawned + self.start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self._process = None
                raise MirrorMakerError(f"MirrorMaker 2 exited ({process.returncode}):\n"
                                       f"{self.read_log()}")  # fmt: skip
            if STARTED in self._log_since(offset) and self._flow_running():
                self.started_s = time.monotonic() - spawned
                return self
            time.sleep(0.5)
        self.stop()
        raise MirrorMakerError(f"MirrorMaker 2 did not start in {self.start_timeout_s} s:\n"
                               f"{self.read_log()}")  # fmt: skip

    def _flow_running(self) -> bool:
        from confluent_kafka.admin import AdminClient

        source = AdminClient({"bootstrap.servers": self.source}).list_topics(timeout=10).topics
        target = AdminClient({"bootstrap.servers": self.target}).list_topics(timeout=10).topics
        copies = [self.remote(t) for t in self.topics if t in source]
        return all(name in target for name in [self.checkpoints_topic, *copies])

    def _log_since(self, offset: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def rss_kb(self) -> int | None:
        """The resident set of MM2's JVM (kB), while it runs (Linux ``/proc``)."""
        if self.pid is None:
            return None
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return None

    # -- waits: what MM2 wrote, read as the platform reads it -------------------------------

    @property
    def offsets_topic(self) -> str:
        """Kafka Connect's offsets topic of this flow's worker, on the target."""
        return f"mm2-offsets.{self.source_alias}.internal"

    def copied_offsets(self) -> dict[tuple[str, int], int]:
        """Per source (topic, partition): the last source offset MM2 committed as copied."""
        import json

        from confluent_kafka import TopicPartition

        found: dict[tuple[str, int], int] = {}
        config = {"bootstrap.servers": self.target}
        with open_consumer(config, "mm2-test-offsets") as consumer:
            metadata = consumer.list_topics(timeout=10).topics.get(self.offsets_topic)
            if metadata is None or metadata.error is not None:
                return found
            for partition in sorted(metadata.partitions):
                tp = TopicPartition(self.offsets_topic, partition)
                low, high = consumer.get_watermark_offsets(tp, 10)
                rng = OffsetRange(self.offsets_topic, partition, int(low), int(high))
                for message in iter_range(consumer, rng, 10, "mm2 offsets"):
                    key, value = message.key(), message.value()
                    if key is None or value is None:
                        continue
                    connector, where = json.loads(key)
                    if connector == "MirrorSourceConnector":
                        place = (str(where["topic"]), int(where["partition"]))
                        found[place] = int(json.loads(value)["offset"])
        return found

    def wait_mirrored(self, topic: str, timeout_s: float = 90.0) -> int:
        """Until MM2 has copied (and committed as copied) every record the source's ``topic``
        holds now; how many source records it copied since the last wait on this object
        (the first wait: all of them)."""
        ends = last_offsets(self.source, topic)
        copied: dict[tuple[str, int], int] = {}

        def done() -> bool:
            nonlocal copied
            copied = self.copied_offsets()
            return all(copied.get((topic, p), -1) >= last for p, last in ends.items())

        wait_for(done, timeout_s, lambda: f"{topic} copied through {ends} (at {copied})", self)
        marks = self._marks
        counts = count_records(self.source, topic, {p: marks.get((topic, p), -1) for p in ends})
        for partition, last in ends.items():
            marks[(topic, partition)] = last
        return sum(counts.values())

    def wait_checkpoint(
        self,
        group: str,
        topic: str,
        partition: int,
        upstream: int | None = None,
        timeout_s: float = 90.0,
    ) -> Checkpoint:
        """Until the target holds a checkpoint of ``group`` for the copy of ``topic[partition]``
        (at source offset ``upstream`` or beyond, if given); the newest such checkpoint."""
        key = (self.remote(topic), partition)
        found: list[Checkpoint] = []

        def arrived() -> bool:
            stamped = read_checkpoints({"bootstrap.servers": self.target}, self.checkpoints_topic)
            newest = newest_checkpoints(stamped, group).get(key)
            if newest is None or (upstream is not None and newest.checkpoint.upstream < upstream):
                return False
            found[:] = [newest.checkpoint]
            return True

        what = f"a checkpoint of {group} for {key} at {upstream if upstream is not None else 'any'}"
        wait_for(arrived, timeout_s, lambda: what, self)
        return found[0]


def watermarks(consumer: Any, topic: str, timeout_s: float) -> list[tuple[int, int, int]]:
    """(partition, low, high) of each partition of ``topic``; [] if the topic is absent."""
    from confluent_kafka import TopicPartition

    metadata = consumer.list_topics(timeout=timeout_s).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return []
    bounds = []
    for partition in sorted(metadata.partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout_s)
        bounds.append((partition, int(low), int(high)))
    return bounds


def count_records(
    bootstrap: str, topic: str, after: dict[int, int] | None = None, timeout_s: float = 30.0
) -> dict[int, int]:
    """Records per partition of ``topic`` (read committed, markers not counted), only those
    after offset ``after[partition]`` if given; {} if the topic is absent."""
    counts: dict[int, int] = {}
    with open_consumer({"bootstrap.servers": bootstrap}, "mm2-test-count") as consumer:
        for partition, low, high in watermarks(consumer, topic, timeout_s):
            start = max(low, (after or {}).get(partition, -1) + 1)
            rng = OffsetRange(topic, partition, start, max(start, high))
            counts[partition] = sum(1 for _ in iter_range(consumer, rng, timeout_s, "count"))
    return counts


def last_offsets(bootstrap: str, topic: str, timeout_s: float = 30.0) -> dict[int, int]:
    """Per partition of ``topic`` that holds a record: the offset of its last record (a
    transaction's commit marker after it is not a record)."""
    last: dict[int, int] = {}
    with open_consumer({"bootstrap.servers": bootstrap}, "mm2-test-last") as consumer:
        for partition, low, high in watermarks(consumer, topic, timeout_s):
            for start in (max(low, high - 100), low):  # the tail, else all
                rng = OffsetRange(topic, partition, start, high)
                for message in iter_range(consumer, rng, timeout_s, "last record"):
                    last[partition] = int(message.offset() or 0)
                if partition in last:
                    break
    return last


def wait_for(
    condition: Callable[[], bool], timeout_s: float, what: Callable[[], str], mm2: Any = None
) -> None:
    """Poll ``condition`` every 0.5 s until it holds; raise MirrorMakerError after
    ``timeout_s`` (with MM2's log tail)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            log = mm2.read_log(4_000) if mm2 is not None else ""
            raise MirrorMakerError(f"timed out after {timeout_s} s waiting for {what()}\n{log}")
        time.sleep(0.5)
