"""Which version of the engine this process runs: a fingerprint of the ``ingestion`` package.

The run's driver stamps its fingerprint on every task (:class:`~ingestion.task.spec.TaskSpec`)
and a task refuses to run under another one (:func:`check_engine_version`). A long-lived Spark
(a Spark Connect server, a cluster's executor image, Python workers Spark reuses) keeps the
engine it first imported across a deploy; without the check a task pickled by new code would
run old decode and write code. Read from the package's own files, so the zip that
``spark.ship_engine`` sends carries the same fingerprint as the directory it was made from,
and computed when this module is imported (with the task code that uses it), so a process
whose files are replaced in place afterwards keeps reporting the version it runs.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from importlib import resources
from importlib.resources.abc import Traversable

from ingestion.exceptions import EngineMismatchError


@functools.cache
def engine_fingerprint() -> str:
    """SHA-256 over the engine's ``.py`` files, subpackages included (relative paths and bytes,
    in path order); once per process.

    Example:
        >>> len(engine_fingerprint())
        64
    """
    digest = hashlib.sha256()
    for name, item in sorted(_engine_files(resources.files("ingestion"), "")):
        digest.update(name.encode() + b"\0" + item.read_bytes() + b"\0")
    return digest.hexdigest()


def _engine_files(folder: Traversable, prefix: str) -> Iterator[tuple[str, Traversable]]:
    """Every ``.py`` file below ``folder``, with its path relative to the package."""
    for item in folder.iterdir():
        if item.is_dir() and item.name != "__pycache__":
            yield from _engine_files(item, f"{prefix}{item.name}/")
        elif item.is_file() and item.name.endswith(".py"):
            yield f"{prefix}{item.name}", item


engine_fingerprint()  # now, with the code it describes; see the module docstring


def check_engine_version(pipeline: str, expected: str) -> None:
    """Refuse a task stamped by another engine version (``expected`` empty: not stamped).

    Delivery: raised before the task reads or writes anything; the run fails, nothing is
    committed, and a rerun after the executors were restarted ingests the same offsets.

    Example:
        >>> check_engine_version("orders", engine_fingerprint())
        >>> check_engine_version("orders", "0" * 64)
        Traceback (most recent call last):
        ...
        ingestion.exceptions.EngineMismatchError: pipeline 'orders': this Spark executor ...
    """
    found = engine_fingerprint()
    if expected and expected != found:
        raise EngineMismatchError(
            f"pipeline {pipeline!r}: this Spark executor runs engine {found[:12]}, the run's "
            f"driver engine {expected[:12]}: the executors kept an older (or newer) ingestion "
            "package across a deploy. Restart the Spark Connect server or the executors with "
            "the driver's version, or set spark.ship_engine: true; nothing was read or written"
        )
