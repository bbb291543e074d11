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
from ingestion.kafka.topics import query_watermarks
from resources.jvm import LOG4J2_CONFIG, class_path, java_binary
from resources.process import ManagedProcess

MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"
IDENTITY = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"
DEFAULT = "org.apache.kafka.connect.mirror.DefaultReplicationPolicy"
STARTED = "Kafka MirrorMaker started"


class MirrorMakerError(RuntimeError):
    """MirrorMaker 2 did not start, or did not mirror what a test waited for."""


class Flow:
    """One MM2 flow ``source_alias -> target_alias``: how MM2 names its topics, its
    ``mm2.properties`` lines, and waits on what it wrote.

    ``topics`` are names (escaped into MM2's regex list), ``patterns`` regexes added to them
    (a shared flow mirrors every topic a test creates under its prefix); ``groups`` likewise
    names, ``group_patterns`` regexes. ``identity`` selects ``IdentityReplicationPolicy`` (the
    whole process's policy: every flow of one process shares it). ``config`` adds or overrides
    this flow's properties (e.g. ``offset.lag.max``), written with the flow's prefix.
    """

    def __init__(
        self,
        clusters: dict[str, str],
        source_alias: str,
        target_alias: str,
        topics: list[str],
        groups: list[str],
        *,
        patterns: list[str] | None = None,
        group_patterns: list[str] | None = None,
        identity: bool = False,
        offset_lag_max: int = 100,
        config: dict[str, str] | None = None,
        process: MirrorMaker | None = None,
    ) -> None:
        self.clusters = dict(clusters)
        self.source_alias, self.target_alias = source_alias, target_alias
        self.topics, self.groups = list(topics), list(groups)
        self.patterns, self.group_patterns = list(patterns or []), list(group_patterns or [])
        self.identity = identity
        self.offset_lag_max = offset_lag_max
        self.flow_config = dict(config or {})
        self.process = process  # the MM2 running the flow: its log goes into wait errors
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

    @property
    def offsets_topic(self) -> str:
        """Kafka Connect's offsets topic of this flow's worker, on the target."""
        return f"mm2-offsets.{self.source_alias}.internal"

    def flow_properties(self) -> dict[str, str]:
        """This flow's lines of ``mm2.properties`` (prefixed ``source->target.``)."""
        flow = f"{self.source_alias}->{self.target_alias}"
        topics = [re.escape(t) for t in self.topics] + self.patterns
        groups = [re.escape(g) for g in self.groups] + self.group_patterns
        config = {
            "enabled": "true",
            "topics": ",".join(topics) or "^$",
            "groups": ",".join(groups) or "^$",
            "offset.lag.max": str(self.offset_lag_max),
        } | self.flow_config
        return {f"{flow}.{key}": value for key, value in config.items()}

    def running(self) -> bool:
        """The flow's checkpoints topic and the copy of each of its named topics that exists
        on the source are on the target (MM2's connectors make them once they run)."""
        from confluent_kafka.admin import AdminClient

        source = AdminClient({"bootstrap.servers": self.source}).list_topics(timeout=10).topics
        target = AdminClient({"bootstrap.servers": self.target}).list_topics(timeout=10).topics
        copies = [self.remote(t) for t in self.topics if t in source]
        return all(name in target for name in [self.checkpoints_topic, *copies])

    def narrowed(self, topics: list[str], groups: list[str]) -> Flow:
        """This flow seen through one test's ``topics`` and ``groups`` (which its patterns
        must match): the same alias, worker and checkpoints topic, the test's own waits."""
        for name, allowed in [(t, self.topics + self.patterns) for t in topics] + [
            (g, self.groups + self.group_patterns) for g in groups
        ]:
            assert any(re.fullmatch(rx, name) or rx == name for rx in allowed), (name, allowed)
        return Flow(
            self.clusters,
            self.source_alias,
            self.target_alias,
            topics,
            groups,
            identity=self.identity,
            offset_lag_max=self.offset_lag_max,
            process=self.process,
        )

    # -- waits: what MM2 wrote, read as the platform reads it -------------------------------

    def copied_offsets(self) -> dict[tuple[str, int], int]:
        """Per source (topic, partition): the last source offset MM2 committed as copied.

        Kafka Connect spreads its offsets over the offsets topic's 25 partitions: one consumer
        reads every partition that holds records at once (one partition after the other took
        6.6 s a call)."""
        import json

        from confluent_kafka import TopicPartition

        found: dict[tuple[str, int], int] = {}
        topic = self.offsets_topic
        with open_consumer({"bootstrap.servers": self.target}, "mm2-test-offsets") as consumer:
            bounds = [(p, low, high) for p, low, high in watermarks(consumer, topic, 10)]
            ends = {p: high for p, low, high in bounds if high > low}
            consumer.assign(
                [TopicPartition(topic, p, low) for p, low, high in bounds if high > low]
            )
            deadline = time.monotonic() + 30
            while ends and time.monotonic() < deadline:  # else what it read: a wait polls again
                for message in consumer.consume(num_messages=500, timeout=0.5):
                    if message.error() is not None:
                        raise MirrorMakerError(f"{topic}: {message.error()}")
                    key, value = message.key(), message.value()
                    if key is not None and value is not None:
                        connector, where = json.loads(key)
                        if connector == "MirrorSourceConnector":
                            place = (str(where["topic"]), int(where["partition"]))
                            found[place] = int(json.loads(value)["offset"])
                positions = consumer.position([TopicPartition(topic, p) for p in ends])
                for position in positions:  # past the end (markers and gaps included)
                    if position.offset >= ends[position.partition]:
                        del ends[position.partition]
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

        def what() -> str:
            return f"{topic} copied through {ends} (at {copied})"

        wait_for(done, timeout_s, what, self.process)
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
        wait_for(arrived, timeout_s, lambda: what, self.process)
        return found[0]


class MirrorMaker(Flow, ManagedProcess):
    """MM2 in dedicated mode running its own flow ``source_alias -> target_alias`` (the
    constructor's arguments, as :class:`Flow`) and any ``lanes``: more flows into the same
    process (one JVM, one herder each), as a context manager.

    A lane is how a test session shares one MM2: each lane has its own source alias (several
    aliases may name one cluster), so its own checkpoints topic and worker; it mirrors the
    topics under its patterns as tests create them (``refresh.topics.interval.seconds`` 1).
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
        patterns: list[str] | None = None,
        group_patterns: list[str] | None = None,
        lanes: list[Flow] | None = None,
    ) -> None:
        super().__init__(
            clusters,
            source_alias,
            target_alias,
            topics,
            groups,
            patterns=patterns,
            group_patterns=group_patterns,
            identity=identity,
            offset_lag_max=offset_lag_max,
        )
        self.process = self
        self.log_path = Path(log_path)
        self.sync_group_offsets = sync_group_offsets
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.extra_config = dict(config or {})
        self.lanes = list(lanes or [])
        for lane in self.lanes:
            lane.process = self
            self.clusters |= lane.clusters
        self.started_s: float | None = None  # seconds from spawn to a running flow

    @property
    def flows(self) -> list[Flow]:
        """Its own flow, then its lanes."""
        return [self, *self.lanes]

    def lane(self, source_alias: str) -> Flow:
        """The flow (its own or a lane) whose source alias is ``source_alias``."""
        (found,) = [flow for flow in self.flows if flow.source_alias == source_alias]
        return found

    # -- process ----------------------------------------------------------------------------

    def properties(self) -> dict[str, str]:
        """The ``mm2.properties`` of this process: every flow, no other way enabled."""
        aliases = list(
            dict.fromkeys(a for f in self.flows for a in (f.source_alias, f.target_alias))
        )
        config = {
            "clusters": ", ".join(aliases),
            **{f"{alias}.bootstrap.servers": self.clusters[alias] for alias in aliases},
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
            # Heartbeats would add a heartbeats topic per cluster and start a herder for the
            # disabled way back; ACL sync needs an authorizer the embedded brokers lack.
            "emit.heartbeats.enabled": "false",
            "sync.topic.acls.enabled": "false",
            # Kafka Connect's offsets and status topics with one partition, not 25 and 5: made
            # and read at each worker's start, and copied_offsets reads the offsets topic.
            "offset.storage.partitions": "1",
            "status.storage.partitions": "1",
            # Kafka Connect finds MM2's connectors through their ServiceLoader manifests instead
            # of scanning every jar of the class path (its "hybrid" default, which logs that
            # this should be set): here for MM2's own configuration, and under each target's
            # prefix below for each flow's worker; each scan took 2.7-3.7 s.
            "plugin.discovery": "service_load",
        }
        for target in {flow.target_alias for flow in self.flows}:
            # Worker settings: MM2 ignores them at the top level (MirrorMakerConfig.workerConfig
            # takes the target cluster's prefixed properties, and a few top-level prefixes such
            # as offset.storage). Kafka Connect's default commits a source task's offsets every
            # 60 s, which every wait_mirrored waited out.
            config[f"{target}.offset.flush.interval.ms"] = "1000"
            config[f"{target}.plugin.discovery"] = "service_load"
        for flow in self.flows:
            config |= flow.flow_properties()
            back = f"{flow.target_alias}->{flow.source_alias}"
            if f"{back}.enabled" not in config:
                config[f"{back}.enabled"] = "false"
        return config | self.extra_config

    def start(self) -> Self:
        """Write the properties, start MM2 and wait until its flows run (bounded): its
        'started' line, then each flow's checkpoints topic and the copy of each named topic
        that exists on the source, which its connectors create once the worker leads its group."""
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
                *self.class_sharing_options(MAIN, cp),
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
                raise MirrorMakerError(
                    f"MirrorMaker 2 exited ({process.returncode}):\n{self.read_log()}"
                )
            if STARTED in self._log_since(offset) and all(f.running() for f in self.flows):
                self.started_s = time.monotonic() - spawned
                return self
            time.sleep(0.5)
        self.stop()
        raise MirrorMakerError(
            f"MirrorMaker 2 did not start in {self.start_timeout_s} s:\n{self.read_log()}"
        )

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


LANES: dict[str, dict[str, Any]] = {
    # source alias -> how its flow differs from MM2's defaults
    "mm": {},
    "mmlag": {"offset_lag_max": 7},  # an offset sync every 8 records: conservative translation
    "mmcp3": {"checkpoints": (3, {"cleanup.policy": "compact"})},  # a wrong shape, made first
    "mmcpdel": {"checkpoints": (1, {"cleanup.policy": "delete"})},  # likewise
}
"""The lanes of the session's shared MM2 (:func:`shared_mirror_maker`)."""


def shared_mirror_maker(log_path: Path, source: str, target: str) -> MirrorMaker:
    """One MM2 process for a test session, from ``source`` to ``target`` (alias ``dr``), with a
    flow per :data:`LANES` entry: the lane ``<alias>`` mirrors every topic named
    ``<alias>-...`` and checkpoints every group named ``<alias>-...``, as tests create them
    (the process's own flow is ``mm``). Its wrong-shaped checkpoints topics are made before
    it starts. Not started: the caller starts and stops it.

    One JVM instead of one per test: a MirrorMaker 2 start costs 25-35 s here, every lane
    shares it (one herder each, started together)."""
    flows = []
    for alias, options in LANES.items():
        clusters = {alias: source, "dr": target}
        mine = [f"{re.escape(alias)}-.*"]
        flow = Flow(
            clusters,
            alias,
            "dr",
            [],
            [],
            patterns=mine,
            group_patterns=mine,
            offset_lag_max=options.get("offset_lag_max", 100),
        )
        if "checkpoints" in options:
            flow.create_checkpoints_topic(*options["checkpoints"])
        flows.append(flow)
    main, *lanes = flows
    return MirrorMaker(
        log_path,
        main.clusters,
        main.source_alias,
        "dr",
        [],
        [],
        patterns=main.patterns,
        group_patterns=main.group_patterns,
        lanes=lanes,
    )


def watermarks(consumer: Any, topic: str, timeout_s: float) -> list[tuple[int, int, int]]:
    """(partition, low, high) of each partition of ``topic``; [] if the topic is absent."""

    metadata = consumer.list_topics(timeout=timeout_s).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return []
    bounds = []
    for partition in sorted(metadata.partitions):
        low, high = query_watermarks(consumer, topic, partition, timeout_s)
        bounds.append((partition, low, high))
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
