"""A driver that dies hard: runs one pipeline (tasks in-process) and SIGKILLs itself at a point.

Run as ``python -m tests.support.killed_driver CONFIG.json``; CONFIG holds ``spec`` (a spec's
JSON), ``bootstrap_servers``, ``state_dir`` and ``point`` (a
:data:`ingestion.pipeline.hooks.HookPoint`).
No ``finally`` block, ``atexit`` handler or buffered write of the driver runs after the kill.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ingestion.pipeline.hooks import FailureHooks
from ingestion.pipeline.run import run_pipeline
from ingestion.spec.pipeline import PipelineSpec
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def kill_self(point: str, **context: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    spec = PipelineSpec.model_validate(config["spec"])
    kafka = KafkaResource(bootstrap_servers=config["bootstrap_servers"])
    catalog = IcebergCatalogResource(state_dir=config["state_dir"]).load_catalog()
    hooks = FailureHooks({config["point"]: kill_self})
    run_pipeline(spec, kafka.client_config(), catalog, None, kafka.get_cluster_id(), hooks=hooks)
    return 0  # the point was never reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
