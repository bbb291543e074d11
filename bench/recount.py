"""The exactly-once audit's recount rate: offsets per second it reads back from Kafka.

    .venv/bin/python bench/recount.py [--records 1000000] [--partitions 4]

Starts an embedded broker, produces the demo events, then times ``count_visible`` over all
of them: the read_committed read the audit's recount makes (``iter_batches``, as in
``ingestion.audit.snapshots.check_count``). The audit's budget per evaluation (the pipeline's
``audit_recount_offsets``) is sized from this rate (docs/operate.md, "The exactly-once
audit's budget and backlog").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.workloads import produce  # noqa: E402
from ingestion.kafka.consumer import count_visible  # noqa: E402
from ingestion.kafka.ranges import OffsetRange  # noqa: E402
from resources.embedded import EmbeddedBroker  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402


def main() -> None:
    """Produce, recount, print offsets/s."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedBroker(log_path=Path(tmp) / "kafka.log") as broker,
    ):
        kafka = KafkaResource(bootstrap_servers=broker.bootstrap_servers)
        from confluent_kafka.admin import NewTopic

        admin = kafka.get_admin_client()
        for future in admin.create_topics([NewTopic("recount", args.partitions, 1)]).values():
            future.result(15)
        rate = produce(kafka.client_config(), "recount", args.records, args.partitions)
        print(f"produced {args.records} records at {rate:,.0f}/s")
        per = args.records // args.partitions
        ranges = [
            OffsetRange("recount", p, 0, per + (1 if p < args.records % args.partitions else 0))
            for p in range(args.partitions)
        ]
        started = time.monotonic()
        visible = count_visible(kafka.client_config(), ranges, "bench-audit", 30.0)
        elapsed = time.monotonic() - started
        print(
            f"recounted {visible} visible records in {elapsed:.1f} s: "
            f"{visible / elapsed:,.0f} offsets/s"
        )


if __name__ == "__main__":
    main()
