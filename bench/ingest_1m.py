"""Ingest 1,000,000 JSON order events from 8 partitions and print the oracle's verdict.

Run by hand (not in CI): ``.venv/bin/python bench/ingest_1m.py [--records N] [--master local[2]]``.
It starts its own embedded broker and a throw-away catalog, produces realistic order events
(~170 bytes, keyed) with the ledger producer, runs the engine once (plan -> Spark -> commit),
then audits the table against the ledger: duplicates, missing, unexpected, shared files.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka.admin import NewTopic  # noqa: E402

from bench.workloads import BROKER_STOP_S  # noqa: E402
from ingestion.audit.oracle import audit_table  # noqa: E402
from ingestion.pipeline.run import run_pipeline  # noqa: E402
from ingestion.spec.pipeline import load_pipeline_specs  # noqa: E402
from platform_assets.demo import encode_event, make_order_event  # noqa: E402
from resources.embedded import EmbeddedBroker  # noqa: E402
from resources.iceberg import IcebergCatalogResource  # noqa: E402
from resources.kafka import KafkaResource  # noqa: E402
from resources.spark import SparkResource  # noqa: E402
from tests.support.ledger import Ledger, LedgerProducer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="ingest-1m-"))
    with EmbeddedBroker(log_path=state / "kafka.log", stop_timeout_s=BROKER_STOP_S) as broker:
        kafka = KafkaResource(bootstrap_servers=broker.bootstrap_servers)
        admin = kafka.get_admin_client()
        for future in admin.create_topics([NewTopic("orders", args.partitions, 1)]).values():
            future.result(15)
        rng = random.Random(42)
        ledger = Ledger()
        producer = LedgerProducer(kafka, ledger, **{"linger.ms": 20, "batch.size": 1_000_000})
        started = time.monotonic()
        chunk = 100_000
        for first in range(0, args.records, chunk):
            batch = [
                (f"ord-{i:09d}".encode(), encode_event(make_order_event(rng, i)), None)
                for i in range(first, min(first + chunk, args.records))
            ]
            producer.produce("orders", batch)
        produce_s = time.monotonic() - started
        print(
            f"produced {args.records:,} records in {produce_s:.1f} s "
            f"({args.records / produce_s:,.0f} rec/s)",
            flush=True,
        )

        spec = load_pipeline_specs(ROOT / "platform_assets" / "pipelines.yaml")[0]
        spec = spec.model_copy(update={"max_records_per_run": None})
        catalog = IcebergCatalogResource(state_dir=str(state)).load_catalog()
        spark_resource = SparkResource(master=args.master)
        spark = spark_resource.spark_session
        spark.range(4).collect()  # JVM and Python workers warm: measure the engine only
        report = run_pipeline(spec, kafka.client_config(), catalog, spark, kafka.get_cluster_id())
        print(
            f"ingested {report.records:,} records, {report.quarantined} quarantined, "
            f"{report.files} files, {report.bytes_written / 1e6:.1f} MB in "
            f"{report.timings_s['total']:.1f} s = {report.records_per_s:,.0f} rec/s "
            f"(plan {report.timings_s['plan']:.2f} s, prepare "
            f"{report.timings_s['prepare']:.1f} s, commit {report.timings_s['commit']:.2f} s)",
            flush=True,
        )
        table = catalog.load_table(spec.table)
        audit_started = time.monotonic()
        result = audit_table(table, spec.consumer_group_id, expected=ledger.committed())
        print(
            f"oracle: {'OK' if result.ok else 'FAILED'} ({result.summary()}) "
            f"in {time.monotonic() - audit_started:.1f} s"
        )
        spark_resource.stop_session()
        del producer
        gc.collect()  # close the Kafka clients while the broker is up: no reconnect noise
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
