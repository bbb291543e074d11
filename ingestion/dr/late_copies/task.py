"""The executor's side of MM2's late copies (R54; design: ``ingestion.dr.late_copies.guard``):
a record guard (``ingestion.task.spec``) that takes a task's candidates, or its byte-for-byte
late copies, out of a chunk before it is decoded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingestion.dr.align import digest_record, key_digest
from ingestion.dr.late_copies.guard import WeakId, strong_id
from ingestion.task.spec import Screened

if TYPE_CHECKING:
    from ingestion.task.spec import RawChunk


@dataclass(frozen=True)
class LateCopyScreen:
    """One partition's record guard: its uncopied records' (timestamp, key digest) pairs, and
    once read on their clusters, their byte-for-byte identities (``strong``)."""

    weak: frozenset[WeakId]
    strong: frozenset[bytes] | None = None
    needs_headers: bool = True  # a late copy's identity covers its headers

    def screen(self, raw: RawChunk, keep_headers: bool) -> tuple[RawChunk, Screened]:
        """:func:`set_aside` with this partition's pairs and identities."""
        return set_aside(raw, self.weak, self.strong, keep_headers)


def set_aside(
    raw: RawChunk, weak: frozenset[WeakId], strong: frozenset[bytes] | None, keep_headers: bool
) -> tuple[RawChunk, Screened]:
    """``raw`` without its candidates (``strong`` None: counted, with the pairs they met, for
    the coordinator to read) or its late copies (``strong`` given: the candidates equal byte for
    byte to a record of one of the partition's entries), and what was taken."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from ingestion.task.spec import RawChunk

    taken = Screened()
    stamps = pa.array(sorted({stamp for stamp, _ in weak}), pa.int64())
    hits = pc.is_in(pa.array(raw.timestamps, pa.int64()), value_set=stamps)
    drop: set[int] = set()
    for i in pc.indices_nonzero(hits).to_pylist():
        if (raw.timestamps[i], key_digest(raw.keys[i])) not in weak:
            continue
        if strong is None:
            taken.candidates += 1
            taken.met.add((raw.timestamps[i], key_digest(raw.keys[i])))
            drop.add(i)
            continue
        headers = raw.headers[i] if raw.headers is not None else None
        digest = digest_record(raw.values[i], headers)
        if strong_id(raw.timestamps[i], raw.keys[i], digest) in strong:
            taken.skipped.append(raw.offsets[i])
            drop.add(i)
    if not drop:  # the usual chunk: nothing to copy (each chunk is the reader's own)
        if not keep_headers:
            raw.headers = None
        return raw, taken
    keep = [i for i in range(len(raw.offsets)) if i not in drop]
    out = RawChunk(
        headers=[raw.headers[i] for i in keep] if keep_headers and raw.headers is not None else None
    )
    out.offsets = [raw.offsets[i] for i in keep]
    out.keys = [raw.keys[i] for i in keep]
    out.values = [raw.values[i] for i in keep]
    out.timestamps = [raw.timestamps[i] for i in keep]
    out.value_bytes = sum(len(v) for v in out.values if v is not None)
    return out, taken
