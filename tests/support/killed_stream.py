"""A stream that dies hard: ``stream_pipeline`` (tasks in-process) SIGKILLs itself at a point.

Run as ``python -m tests.support.killed_stream CONFIG.json``; CONFIG holds ``spec``,
``bootstrap_servers``, ``state_dir``, ``point`` and ``hit`` (the kill comes at the ``hit``-th
time the point fires, so earlier iterations commit). Until then it commits every 0.2 s.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ingestion.pipeline.hooks import FailureHooks
from ingestion.pipeline.stream import stream_pipeline
from ingestion.spec.pipeline import PipelineSpec
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    spec = PipelineSpec.model_validate(config["spec"])
    kafka = KafkaResource(bootstrap_servers=config["bootstrap_servers"])
    catalog = IcebergCatalogResource(state_dir=config["state_dir"]).load_catalog()
    fired = [0]

    def kill_at_hit(point: str, **context: Any) -> None:
        fired[0] += 1
        if fired[0] >= config["hit"]:
            os.kill(os.getpid(), signal.SIGKILL)

    stream_pipeline(
        spec,
        kafka.client_config(),
        catalog,
        kafka.get_cluster_id(),
        0.2,
        should_stop=lambda: None,
        on_report=lambda report: None,
        hooks=FailureHooks({config["point"]: kill_at_hit}),
    )
    return 0  # never reached: the stream runs until killed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
