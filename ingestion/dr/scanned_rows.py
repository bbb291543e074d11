"""One table scan per topic for a failback plan, held as columns: its windows answered again.

A failback plan asks, per replica partition, for the table's rows in offset windows at or after the
failover's start there: the alignment (``ingestion.dr.failover``), the replica's copies of the
origin's tail (``ingestion.dr.failback.copies``, ``ingestion.dr.failback.lost``). Each scan plans
the table's files anew (every manifest is read), which dominated the plan when made once per
partition and stage. :func:`scan_rows` reads the topic once, for exactly the partitions and floors
the plan names (``(partition = p AND offset >= floor_p) OR ...``: a partition the failover's plan
lacks is not scanned, its windows are scanned alone by the caller), and :class:`ScannedRows` keeps
the rows as columns, not Python objects.

What is held, per row kept: its offset and timestamp (int64: 8 bytes each) and its key (the
bytes, a 4-byte offset and a validity bit): about 20 bytes plus the key, where a list of
(offset, RecordId) takes about 0.3 KB. No value is held: a table row carries no value digest
(``ingestion.dr.align.RecordId``). The rows kept are those of the named partitions from
their floors on (the failover's start): at worst every row the table ingested on the replica
since the failover (a 10M-record stay with 16-byte keys: about 360 MB, not 3 GB). A window is
built as (offset, RecordId) when asked, one partition at a time, and dropped by its caller:
the peak adds the largest window, what a scan of that one partition held before. While
scanning, the Arrow table of the matching rows, the sort's index arrays and the sorted copy
are held (two to three times the kept size, freed at once). Measured on 200k rows of 8
partitions, 18-byte keys: 38 bytes per row kept; the plan's Python peak 14 MiB, not 77 MiB.

Answers: a window is what a fresh :func:`~ingestion.dr.rows.ingested_tail` of the same
partition, offsets and cluster returns (per offset the last row read wins, the quarantine
table's over the data table's); a window reaching below the floor, or of a partition not
scanned, answers None and the caller scans it alone. Reads only; retrying is safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingestion.dr.align import RecordId
from ingestion.dr.rows import Records, matching_rows

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyiceberg.table import Table

Floors = dict[int, int]
"""Per partition, the lowest offset a plan asks about (the failover's start there)."""


def covers(held: Floors, asked: Floors) -> bool:
    """Whether rows kept from ``held`` answer every window from ``asked``.

    Example:
        >>> covers({0: 5, 1: 7}, {0: 6}), covers({0: 5}, {0: 4}), covers({0: 5}, {1: 9})
        (True, False, False)
    """
    return all(p in held and held[p] <= floor for p, floor in asked.items())


@dataclass(frozen=True)
class _Part:
    """One partition's rows in offset order: offsets, timestamps (µs), keys."""

    offsets: np.ndarray
    micros: np.ndarray
    keys: pa.Array


@dataclass(frozen=True)
class ScannedRows:
    """The table's rows of one topic from ``floors`` on, per partition, as columns.

    Example:
        >>> import pyarrow as pa
        >>> rows = ScannedRows.from_arrow({0: 10, 1: 0}, pa.table({
        ...     "partition": [0, 0, 0], "offset": [12, 10, 12],
        ...     "micros": [2000, 1000, 3999], "key": [b"b", b"a", b"c"]}))
        >>> rows.window(0, 11, 13)  # offset 12 twice: the last row read wins
        [(12, RecordId(timestamp_ms=3, key=b'c', value_digest=None))]
        >>> rows.window(0, 9, 13), rows.window(1, 0, 20), rows.window(2, 0, 20)
        (None, [], None)
        >>> rows.holds_until(0, 11), rows.holds_until(0, 9), rows.holds_until(1, 50)
        (True, None, None)
    """

    floors: Floors
    parts: dict[int, _Part]

    @classmethod
    def from_arrow(cls, floors: Floors, rows: pa.Table) -> ScannedRows:
        """From ``rows`` (columns partition, offset, micros, key) in the order they were read:
        sorted by partition and offset, one row per offset (the last one read)."""
        import numpy as np

        partitions = rows.column("partition").to_numpy().astype(np.int64)
        offsets = rows.column("offset").to_numpy().astype(np.int64)
        later_first = -np.arange(len(offsets), dtype=np.int64)
        order = np.lexsort((later_first, offsets, partitions))
        partitions, offsets = partitions[order], offsets[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (partitions[1:] != partitions[:-1]) | (offsets[1:] != offsets[:-1])
        order, partitions, offsets = order[first], partitions[first], offsets[first]
        micros = rows.column("micros").to_numpy()[order]
        keys = rows.column("key").take(order).combine_chunks()
        found, starts = np.unique(partitions, return_index=True)
        ends = [*starts[1:].tolist(), len(order)][: len(found)]
        parts = {
            int(p): _Part(offsets[s:e], micros[s:e], keys.slice(s, e - s))
            for p, s, e in zip(found.tolist(), starts.tolist(), ends, strict=True)
        }
        return cls(dict(floors), parts)

    def window(self, partition: int, start: int, until: int) -> Records | None:
        """The rows with ``start <= offset < until``, as (offset, RecordId) in offset order;
        None when the scan does not cover them (below the partition's floor, or not scanned)."""
        floor = self.floors.get(partition)
        if floor is None or start < floor:
            return None
        part = self.parts.get(partition)
        if part is None or until <= start:
            return []
        low, high = part.offsets.searchsorted([start, until])
        keys = part.keys.slice(low, high - low).to_pylist()
        return [
            (offset, RecordId(micros // 1000, key))
            for offset, micros, key in zip(
                part.offsets[low:high].tolist(), part.micros[low:high].tolist(), keys, strict=True
            )
        ]

    def holds_until(self, partition: int, offset: int) -> bool | None:
        """True when a row at or below ``offset`` was scanned; None when only rows below the
        partition's floor could tell (the scan does not cover them)."""
        part = self.parts.get(partition)
        return True if part is not None and int(part.offsets[0]) <= offset else None

    @property
    def nbytes(self) -> int:
        """The bytes the columns hold (offsets, timestamps, keys)."""
        return sum(p.offsets.nbytes + p.micros.nbytes + p.keys.nbytes for p in self.parts.values())


Scans = dict[tuple[str, str | None], ScannedRows]
"""One plan's scans by (topic, cluster): the failback's two stages read them once."""


def scan_rows(
    tables: list[Table],
    topic: str,
    floors: Floors,
    cluster: str | None = None,
    scans: Scans | None = None,
) -> ScannedRows:
    """:class:`ScannedRows` of ``topic`` from ``floors``: one scan per table (read on
    ``cluster``, if given), or the one ``scans`` holds when it covers them (the same plan read
    it, after the same quarantine sync; rows committed in between lie past the offsets the plan
    read, which every window stops before)."""
    cached = scans.get((topic, cluster)) if scans is not None else None
    if cached is not None and covers(cached.floors, floors):
        return cached
    clauses = [
        f"(_kafka_partition = {p} AND _kafka_offset >= {floor})"
        for p, floor in sorted(floors.items())
    ]
    condition = "(" + " OR ".join(clauses) + ")" if clauses else "_kafka_offset < 0"
    found = ScannedRows.from_arrow(floors, matching_rows(tables, topic, condition, cluster))
    if scans is not None:
        scans[(topic, cluster)] = found
    return found
