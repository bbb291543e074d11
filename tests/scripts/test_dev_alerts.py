"""docs/alerts.md "See an alert" on the real stack: `make dev` (broker, catalog, demo producer,
`dagster dev` with its daemon running the sensors), a wrong consumer_group_id, *Reload definitions*,
and a webhook that counts what arrives: one FAILED, at most one failed run, one RECOVERED after the
fix, and ingestion resumes.

The stack is the session's shared one (tests/support/dev_stack.py: the shipped pipelines file
copied, alerts to the session's webhook receiver); the test restores the file when it ends.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from ingestion.health.state import commits_of
from ingestion.spec.pipeline import load_pipeline_specs
from platform_assets.alerts.sensors import ALERT_SENSOR
from platform_assets.ingest.sensors import LAG_SENSOR
from resources.iceberg import IcebergCatalogResource
from tests.support.dev_stack import (
    DevStack,
    describe_run,
    failed_runs,
    graphql,
    ticks_since,
    wait_for,
)

pytestmark = pytest.mark.integration
GOOD, BAD = "consumer_group_id: platform-orders", "consumer_group_id: connect-sink-group"
TABLE = ["iceberg", "demo", "orders"]
GROUP_CHECK = "group_id_consistency"


def reload_definitions(port: int) -> None:
    """What *Reload definitions* in the UI does."""
    entries = graphql(
        port, "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }"
    )
    (location,) = [e["name"] for e in entries["data"]["workspaceOrError"]["locationEntries"]]  # type: ignore[index]
    answer = graphql(
        port,
        f'mutation {{ reloadRepositoryLocation(repositoryLocationName: "{location}") '
        "{ __typename ... on WorkspaceLocationEntry { loadStatus locationOrLoadError "
        "{ __typename ... on PythonError { message } } } } }",
    )
    result = answer["data"]["reloadRepositoryLocation"]  # type: ignore[index]
    assert result["__typename"] == "WorkspaceLocationEntry", answer
    assert result["locationOrLoadError"]["__typename"] == "RepositoryLocation", answer


def group_check_execution(port: int) -> dict[str, Any]:
    path = json.dumps(TABLE)
    answer = graphql(
        port,
        f"{{ assetNodes(assetKeys: [{{path: {path}}}]) {{ assetChecksOrError {{ ... on "
        "AssetChecks { checks { name executionForLatestMaterialization { status runId "
        "evaluation { description } } } } } } }",
    )
    (node,) = answer["data"]["assetNodes"]  # type: ignore[index]
    checks = {c["name"]: c for c in node["assetChecksOrError"]["checks"]}
    return checks["group_id_consistency"]["executionForLatestMaterialization"] or {}


def test_see_an_alert_one_failed_one_recovered_no_storm(dev_stack: DevStack) -> None:
    started = time.monotonic()
    pipelines, port, webhook = dev_stack.pipelines, dev_stack.port, dev_stack.webhook
    shipped = pipelines.read_text()
    assert GOOD in shipped
    # The demo pipeline as shipped: Spark does every batch, no in-process shortcut.
    (spec,) = [s for s in load_pipeline_specs(pipelines) if s.name == "orders"]
    assert spec.in_process_max_records == 0
    catalog = IcebergCatalogResource(state_dir=str(dev_stack.state_dir))

    def commits() -> list[Any]:
        loaded = catalog.load_catalog()
        if not loaded.table_exists("demo.orders"):
            return []
        return commits_of(loaded.load_table("demo.orders"), "platform-orders", limit=1000)

    def alerts(kind: str, check: str = "group_id_consistency") -> list[dict[str, Any]]:
        return [a for a in webhook.received if a["kind"] == kind and a["details"]["check"] == check]

    try:
        wait_for("a first commit", commits, 180)
        first_phase_s = time.monotonic() - started

        # See an alert: the seed's bad state, then Reload definitions.
        pipelines.write_text(shipped.replace(GOOD, BAD))
        reload_definitions(port)
        broken_at = time.time()
        (failed,) = wait_for("one FAILED alert", lambda: alerts("check_failed"), 180)
        blocked_commits = len(commits())
        alerted_at = time.time()
        wait_for(  # no storm follows: these ticks would have sent it, or committed
            "three more lag sensor ticks and an alert tick",
            lambda: ticks_since(port, alerted_at, {LAG_SENSOR: 3, ALERT_SENSOR: 1}),
            120,
        )
        assert len(alerts("check_failed")) == 1
        assert len(commits()) == blocked_commits, "records were committed while blocked"
        execution = group_check_execution(port)
        assert execution["status"] == "FAILED", execution
        assert "but none under 'connect-sink-group'" in execution["evaluation"]["description"]
        blocked_phase_s = time.monotonic() - started - first_phase_s

        pipelines.write_text(shipped)
        reload_definitions(port)
        fixed_at = time.time()
        (recovered,) = wait_for("one RECOVERED alert", lambda: alerts("check_recovered"), 180)
        wait_for("a commit after the fix", lambda: len(commits()) > blocked_commits, 120)
        recovered_at = time.time()
        wait_for(  # a late duplicate would be sent by the next alert tick
            "an alert tick after the RECOVERED alert",
            lambda: ticks_since(port, recovered_at, {ALERT_SENSOR: 1}),
            90,
        )
        runs = failed_runs(port)
        # The blocked run fails on purpose; any other failed run fails tests/scripts/test_dev.py.
        dev_stack.expected_failures |= {
            run["runId"] for run in runs if any(GROUP_CHECK in error for error in run["errors"])
        }
    finally:
        if pipelines.read_text() != shipped:  # leave the shared stack as it was
            pipelines.write_text(shipped)
            reload_definitions(port)
    total_s = time.monotonic() - started

    print(
        f"\nphases: healthy {first_phase_s:.0f} s, blocked {blocked_phase_s:.0f} s, "
        f"total {total_s:.0f} s"
    )
    for alert in webhook.received:
        print(f"{alert['received_at'] - broken_at:+.0f} s  {alert['text']}")
    for run in runs:
        print("failed run:", describe_run(run))

    # dev.py's exit status and its processes after Ctrl-C: checked when the stack stops
    # (tests/scripts/test_dev.py, or the dev_stack fixture's teardown).
    after_break = [a for a in webhook.received if a["received_at"] >= broken_at]
    assert [a["kind"] for a in after_break] == ["check_failed", "check_recovered"], after_break
    assert not [a for a in webhook.received if a["kind"] == "run_failed"], webhook.received
    assert len(runs) <= 1, runs
    assert recovered["received_at"] >= fixed_at

    text = failed["text"]
    assert text.startswith(
        "[FAILED] pipeline 'orders', check group_id_consistency (ERROR) on iceberg/demo/orders: "
        "table demo.orders holds offsets under group(s) ['platform-orders'] but none under "
        "'connect-sink-group'"
    ), text
    assert "Fix: set consumer_group_id back to 'platform-orders'" in text
    link = f"http://127.0.0.1:{port}/assets/iceberg/demo/orders?view=checks"
    assert f"See {link}&checkDetail=group_id_consistency" in text
    assert recovered["text"].startswith(
        "[RECOVERED] pipeline 'orders', check group_id_consistency on iceberg/demo/orders: "
        "passes again after"
    ), recovered["text"]
