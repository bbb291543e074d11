"""The quarantine sync's plan, pure (no I/O): which quarantine commits bring the quarantine
table up to the data table's commits (the design: ``ingestion.quarantine.sync``)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from ingestion.kafka.ranges import Key
from ingestion.table.offsets import OffsetMap, flatten


def encode_file_list(location: str, paths: list[str]) -> str:
    """The quarantine files a data commit names, relative to the quarantine table's location.

    Example:
        >>> encode_file_list("s3://w/q", ["s3://w/q/data/a.parquet", "s3://x/b.parquet"])
        '["data/a.parquet","s3://x/b.parquet"]'
    """
    prefix = location.rstrip("/") + "/"
    return orjson.dumps([p.removeprefix(prefix) for p in paths]).decode()


def decode_file_list(location: str, text: str) -> tuple[str, ...]:
    """Full paths of :func:`encode_file_list` output.

    Example:
        >>> decode_file_list("s3://w/q/", '["data/a.parquet","s3://x/b.parquet"]')
        ('s3://w/q/data/a.parquet', 's3://x/b.parquet')
    """
    prefix = location.rstrip("/") + "/"
    names = orjson.loads(text)
    return tuple(n if "://" in n or n.startswith("/") else prefix + n for n in names)


@dataclass(frozen=True)
class SourceCommit:
    """A commit of the data table (run, reset or migration) as the quarantine table sees it."""

    sequence: int
    commit_id: str
    offsets: OffsetMap
    files: tuple[str, ...] = ()
    cluster_id: str = ""  # the Kafka cluster its offsets refer to ("": not recorded)
    cluster: str = "primary"  # its name, as rows record it (``_kafka_cluster``; "": any)


@dataclass(frozen=True)
class Step:
    """One quarantine commit: delete rows at or after ``cuts``, add the commit's files."""

    commit: SourceCommit
    cuts: dict[Key, int]


def plan_sync(
    synced: dict[Key, int],
    newer: list[SourceCommit],
    before: dict[Key, int] | None,
    head: SourceCommit | None,
    synced_cluster: str | None = None,
    labelled: bool = False,
) -> list[Step]:
    """The quarantine commits that bring the quarantine table up to the data table (pure).

    A cut is a rewind: a commit whose offset of a partition is below the last one committed on
    the same cluster. A failover or failback switches the group to another cluster's topic;
    under MM2's identity naming it has the same name (``orders`` on the replica and on the
    primary) but unrelated offsets: its lower offsets are no rewind, and the dead letters read
    on the other cluster must stay. Where the quarantine rows record their cluster
    (``labelled``: ``_kafka_cluster``; the cut then deletes only the rows of the commit's
    cluster, ``SourceCommit.cluster``), each cluster's rewinds cut its own rows, also after a
    switch. Without the column a cut applies only while the commit's offsets refer to the
    cluster the synced rows were read on (it would delete the other cluster's rows too).

    Args:
        synced: offsets of the last reflected commit: no quarantine row lies at or beyond them.
        newer: the data table's commits after it, oldest first.
        before: offsets of the commit before ``newer[0]``; ``{}`` when there is none, None when
            it expired (then nothing below the commits' own offsets is deleted).
        head: the data table's newest commit (None: none in its lineage; with ``before``
            None too, another tool expired them all, R56: nothing is cut).
        synced_cluster: cluster id of the last reflected commit (None or "": unknown, every
            cut holds, as before clusters were compared).
        labelled: the quarantine table has ``_kafka_cluster``.

    Example (a reset back to 5, then a run re-reading [5, 9) with dead letters):
        >>> from ingestion.table.offsets import TopicOffsets
        >>> reset = SourceCommit(2, "r", {"t": TopicOffsets("id", {0: 5})})
        >>> run = SourceCommit(3, "c", {"t": TopicOffsets("id", {0: 9})}, ("f.parquet",))
        >>> [(s.commit.commit_id, s.cuts) for s in plan_sync({("t", 0): 9}, [reset, run],
        ...     {("t", 0): 9}, run)]
        [('r', {('t', 0): 5}), ('c', {})]
    """
    steps = []
    bound = dict(synced)
    cluster = synced_cluster
    # Each partition's last committed offset on each cluster: a partition a commit leaves out
    # (a reset that dropped a topic, a switch to the replica's copy) and a later one brings back
    # (a failback) is rewound only below where it was left on that cluster, not below 0, nor
    # below where a topic of the same name was read on another cluster (identity naming).
    # ``before`` is the last reflected commit: it was read on the synced cluster.
    here = cluster or ""
    known = {(here, k): o for k, o in (before if before is not None else bound).items()}
    for commit in newer:
        end = flatten(commit.offsets)
        # A partition absent from the commit's offsets (a reset that dropped a topic) keeps its
        # data rows, so it keeps its dead letters too: no cut. Nor after a cluster switch.
        same = _same_cluster(cluster, commit)
        here = commit.cluster_id or cluster or ""
        # A state from before clusters were recorded ("" cluster): assume the same cluster.
        if same:
            last = {key: known.get((here, key), known.get(("", key), 0)) for key in bound}
            cuts = {key: min(last[key], end[key]) for key in bound if key in end}
            cuts = {key: cut for key, cut in cuts.items() if cut < bound[key]}
        elif labelled:  # rows record their cluster: a rewind on this one cuts its rows only
            mine = {key: known.get((here, key)) for key in end}  # this cluster's own, if known
            cuts = {k: end[k] for k, o in mine.items() if o is not None and end[k] < o}
        else:
            cuts = {}
        if commit.files or cuts:
            steps.append(Step(commit, cuts))
            bound = end
            cluster = commit.cluster_id or cluster
        known.update({(here, key): offset for key, offset in end.items()})
    if not newer and head is None and before is None:
        return []  # another tool expired every commit (R56): no rollback is proven, rows stay
    if not newer:  # rolled back (or emptied) past the last reflected commit: truncate to it
        end = flatten(head.offsets) if head else {}
        cuts = {
            key: end.get(key, 0)
            for key in bound
            if end.get(key, 0) < bound[key] and (head is None or _same_cluster(cluster, head))
        }
        if cuts:
            steps.append(Step(head or SourceCommit(0, "", {}, cluster=""), cuts))
    return steps


def _same_cluster(cluster: str | None, commit: SourceCommit) -> bool:
    """Whether ``commit``'s offsets refer to the cluster the synced rows were read on (either
    unknown, as in a state written before clusters were compared: assume so)."""
    return not cluster or not commit.cluster_id or cluster == commit.cluster_id


def rows_at_or_after(cuts: dict[Key, int]) -> str:
    """A row filter: rows of each (topic, partition) at or after its offset in ``cuts``.

    Kafka topic names are ``[a-zA-Z0-9._-]``: nothing to escape.

    Example:
        >>> rows_at_or_after({("t", 1): 7})
        "(_kafka_topic = 't' and _kafka_partition = 1 and _kafka_offset >= 7)"
    """
    return " or ".join(
        f"(_kafka_topic = '{topic}' and _kafka_partition = {partition} "
        f"and _kafka_offset >= {offset})"
        for (topic, partition), offset in sorted(cuts.items())
    )
