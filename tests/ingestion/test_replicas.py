"""The seam to disaster recovery: a pipeline without ``replicas:`` gets None and loads no
``ingestion.dr`` module; one with replicas gets the add-on, with everything the protocol
names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ingestion.replicas import replica_support
from tests.support.pipelines import make_spec

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import json, sys
from ingestion.replicas import replica_support
from ingestion.spec.pipeline import parse_pipeline_spec
spec = parse_pipeline_spec(json.loads(sys.argv[1]))
support = replica_support(spec)
print(json.dumps({"none": support is None,
                  "dr": sorted(m for m in sys.modules if m.startswith("ingestion.dr"))}))
"""


def ask(spec_json: str) -> dict[str, object]:
    """``replica_support`` in a fresh interpreter: whether it answered None, and the
    ``ingestion.dr`` modules loaded."""
    done = subprocess.run(
        [sys.executable, "-c", CHECK, spec_json],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_replicas_there_is_no_support_and_nothing_of_dr_is_loaded() -> None:
    spec = make_spec("orders", "nodr")
    assert replica_support(spec) is None
    found = ask(spec.model_dump_json(by_alias=True, exclude_none=True))
    assert found == {"none": True, "dr": []}


def test_with_replicas_the_add_on_answers_for_every_part_of_the_protocol() -> None:
    spec = make_spec("orders", "withdr", replicas=[{"name": "dr", "source_alias": "primary"}])
    support = replica_support(spec)
    assert support is not None
    assert type(support).__module__ == "ingestion.dr.support"
    for name in ("check_route", "run_guard", "commit_properties", "name_families"):
        assert callable(getattr(support, name))
    assert support.name_families(spec) == [frozenset({"orders", "primary.orders"})]
    assert ask(spec.model_dump_json(by_alias=True, exclude_none=True))["none"] is False
