"""What the tests' embedded brokers share."""

import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException

from tests.support.dev_stack import wait_for

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

    from resources.embedded import EmbeddedBroker
    from resources.kafka import KafkaResource

BROKER_STOP_S = 0.5
"""How long a test broker gets to exit on SIGTERM before SIGKILL (``stop_timeout_s``). On
SIGTERM Kafka shuts down in a controlled way (seconds, more while clients are connected); the
tests' brokers and their storage are thrown away, so nothing is lost by not waiting."""


def resume_broker(broker: "EmbeddedBroker", timeout_s: float = 90.0) -> None:
    """SIGCONT a SIGSTOPped broker and wait until it serves every partition again.

    A KRaft node stopped for longer than ``broker.session.timeout.ms`` (9 s) fences itself when
    it resumes: until its controller unfences it, every partition has no leader and clients get
    ``LEADER_NOT_AVAILABLE`` / timeouts. A test that resumes a "lost" cluster waits for this, as
    an operator would, before it talks to the cluster again (CI failed on a stand-in's watermark
    query made in that window). A timeout names the process's state, whether its port accepts
    connections and the end of its log (CI once saw a resumed broker refuse metadata for 90 s,
    never seen here: the evidence decides the next fix)."""
    assert broker.pid is not None
    os.kill(broker.pid, signal.SIGCONT)
    try:
        wait_until_serving(broker.bootstrap_servers, timeout_s)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n{describe_broker(broker)}") from None


def process_state(broker: "EmbeddedBroker") -> str:
    """The broker process's ``State:`` line in /proc (``State:\tT (stopped)`` after SIGSTOP),
    "no process" or "exited"."""
    if broker.pid is None:
        return "no process"
    status = Path(f"/proc/{broker.pid}/status")
    lines = status.read_text().splitlines() if status.exists() else []
    return next((line for line in lines if line.startswith("State:")), "exited")


def is_stopped(broker: "EmbeddedBroker") -> bool:
    """Whether the broker's process is stopped (SIGSTOP: state ``T``)."""
    return process_state(broker).split()[1:2] == ["T"]


def wait_until_serving(bootstrap_servers: str, timeout_s: float = 90.0) -> None:
    """Until every partition of every topic on the cluster has a leader (the node is unfenced).

    After a failed probe the next one uses a new client: a client whose only broker answered
    while fenced (no brokers in its metadata) may wait for librdkafka's re-bootstrap (minutes)
    before it connects again."""
    deadline, last = time.monotonic() + timeout_s, "no answer"
    serving_since: float | None = None
    admin = new_admin(bootstrap_servers)
    while time.monotonic() < deadline:
        try:
            metadata = admin.list_topics(timeout=5)
        except KafkaException as exc:
            serving_since, last = None, str(exc)
            admin = new_admin(bootstrap_servers)
        else:
            leaderless = [
                f"{t.topic}[{p.id}]"
                for t in metadata.topics.values()
                for p in t.partitions.values()
                if p.leader < 0 or p.error is not None
            ]
            if not leaderless and metadata.brokers:
                # Serving for 2 s in a row: right after SIGCONT the controller may not have
                # fenced the node yet (its stale-session check and the node's heartbeat race).
                serving_since = serving_since or time.monotonic()
                if time.monotonic() - serving_since >= 2.0:
                    return
            else:
                serving_since = None
                last = f"no leader for {', '.join(leaderless[:5])}" if leaderless else "no broker"
                admin = new_admin(bootstrap_servers)
        time.sleep(0.5)
    raise TimeoutError(f"broker {bootstrap_servers} not serving after {timeout_s:.0f} s: {last}")


def reset_cluster(broker: "EmbeddedBroker", timeout_s: float = 60.0) -> None:
    """Give the next module a cluster as if new: resumed and serving if a test left it stopped
    (:func:`resume_broker`), then every consumer group and every topic but Kafka's own (``__``)
    deleted, waited on until the metadata lists none of them (a topic of the same name can then
    be created again). MM2's topics go too: its stored source offsets, checkpoints and offset
    syncs would otherwise steer the next module's flows.

    Kafka refuses to delete a group with members: a client or an MM2 flow still running, which
    a test or fixture should have stopped; the error names the group."""
    if is_stopped(broker):
        resume_broker(broker, timeout_s)
    admin = new_admin(broker.bootstrap_servers)
    listed = admin.list_consumer_groups(request_timeout=10).result()
    groups = [group.group_id for group in listed.valid]
    if groups:
        for group, future in admin.delete_consumer_groups(groups, request_timeout=10).items():
            try:
                future.result()
            except KafkaException as exc:
                raise AssertionError(f"{broker.name}: group {group} not deleted: {exc}") from None
    topics = [name for name in admin.list_topics(timeout=10).topics if not name.startswith("__")]
    if topics:
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            future.result()
    what = f"{broker.name}'s deleted topics {sorted(topics)} to leave the metadata"

    def gone() -> bool:
        return not set(topics) & set(admin.list_topics(timeout=10).topics)

    wait_for(what, gone, timeout_s, every_s=0.2)


def new_admin(bootstrap_servers: str) -> "AdminClient":
    """An admin client that logs errors only (a probe expects refusals)."""
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3})


def describe_broker(broker: "EmbeddedBroker") -> str:
    """The broker process's state (/proc), whether its port accepts a TCP connection, and the
    last lines of its log: what a test prints when a broker does not serve."""
    state = process_state(broker)
    host, _, port = broker.bootstrap_servers.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            accepts = "accepts connections"
    except OSError as exc:
        accepts = f"refuses connections ({exc})"
    log = (
        broker.log_path.read_text(errors="replace").splitlines() if broker.log_path.exists() else []
    )
    tail = "\n".join(log[-30:])
    return f"pid {broker.pid}: {state}; port {port} {accepts}; {broker.log_path} ends:\n{tail}"


def delete_records(kafka: "KafkaResource", topic: str, partition: int, before: int) -> None:
    """Kafka's retention, now: the broker deletes ``topic``'s records before ``before`` in
    ``partition``; wait (with a 30 s deadline) until the partition's log start says so."""
    from confluent_kafka import TopicPartition

    deadline_s = 30.0
    admin = kafka.get_admin_client()
    for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
        future.result(deadline_s)
    consumer = kafka.get_consumer()
    try:
        deadline = time.monotonic() + deadline_s
        while True:
            low, _ = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10, cached=False
            )
            if low >= before:
                return
            assert time.monotonic() < deadline, f"log start still {low}, not {before}"
            time.sleep(0.1)
    finally:
        consumer.close()
