"""README "See an alert" on the real stack: `make dev` (broker, catalog, demo producer, `dagster
dev` with its daemon running the sensors), a wrong consumer_group_id, *Reload definitions*, and a
webhook that counts what arrives: one FAILED, at most one failed run, one RECOVERED after the fix,
and ingestion resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ingestion.state import commits_of
from platform_assets.pipelines import PIPELINES_FILE
from resources.embedded import find_free_port
from resources.iceberg import IcebergCatalogResource
from tests.test_dev_stack import descendants, graphql, is_running

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration
GOOD, BAD = "consumer_group_id: platform-orders", "consumer_group_id: connect-sink-group"
TABLE = ["iceberg", "demo", "orders"]


class Webhook(BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Webhook.received.append({**body, "received_at": time.time()})
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def webhook() -> Iterator[str]:
    Webhook.received = []
    server = HTTPServer(("127.0.0.1", 0), Webhook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/alerts"
    server.shutdown()
    server.server_close()


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float, every_s: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


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


def failed_runs(port: int) -> list[dict[str, Any]]:
    answer = graphql(
        port,
        "{ runsOrError(filter: {statuses: [FAILURE]}) { ... on Runs { results { runId jobName "
        "tags { key value } assetSelection { path } assetCheckSelection { name } } } } }",
    )
    return answer["data"]["runsOrError"]["results"]  # type: ignore[index]


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


def test_see_an_alert_one_failed_one_recovered_no_storm(tmp_path: Path, webhook: str) -> None:
    started = time.monotonic()
    pipelines = tmp_path / "pipelines.yaml"
    text = PIPELINES_FILE.read_text()
    assert GOOD in text
    # The demo pipeline as shipped, preparing small runs in the driver (no Spark start per run).
    pipelines.write_text(text.replace(GOOD, f"{GOOD}\n    in_process_max_records: 100000"))
    state_dir, port = tmp_path / "platform", find_free_port()
    env = {
        **os.environ,
        "PLATFORM_PIPELINES_FILE": str(pipelines),
        "PLATFORM_ALERT_WEBHOOK_URL": webhook,
    }
    env.pop("PLATFORM_UI_BASE_URL", None)  # scripts/dev.py points it at its UI
    process = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts" / "dev.py"),
            "--state-dir",
            str(state_dir),
            "--ui-port",
            str(port),
            "--rate",
            "50",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    catalog = IcebergCatalogResource(state_dir=str(state_dir))
    children: set[int] = set()

    def commits() -> list[Any]:
        loaded = catalog.load_catalog()
        if not loaded.table_exists("demo.orders"):
            return []
        return commits_of(loaded.load_table("demo.orders"), "platform-orders", limit=1000)

    def alerts(kind: str, check: str = "group_id_consistency") -> list[dict[str, Any]]:
        return [a for a in Webhook.received if a["kind"] == kind and a["details"]["check"] == check]

    try:
        wait_for("the UI", lambda: _answers(port), 180, every_s=1)
        children = descendants(process.pid)
        wait_for("a first commit", commits, 180)
        first_phase_s = time.monotonic() - started

        # See an alert: the seed's bad state, then Reload definitions.
        pipelines.write_text(pipelines.read_text().replace(GOOD, BAD))
        reload_definitions(port)
        broken_at = time.time()
        (failed,) = wait_for("one FAILED alert", lambda: alerts("check_failed"), 180)
        blocked_commits = len(commits())
        time.sleep(45)  # three more lag sensor ticks and an alert tick: no storm follows
        assert len(alerts("check_failed")) == 1
        assert len(commits()) == blocked_commits, "records were committed while blocked"
        execution = group_check_execution(port)
        assert execution["status"] == "FAILED", execution
        assert "but none under 'connect-sink-group'" in execution["evaluation"]["description"]
        blocked_phase_s = time.monotonic() - started - first_phase_s

        pipelines.write_text(pipelines.read_text().replace(BAD, GOOD))
        reload_definitions(port)
        fixed_at = time.time()
        (recovered,) = wait_for("one RECOVERED alert", lambda: alerts("check_recovered"), 180)
        wait_for("a commit after the fix", lambda: len(commits()) > blocked_commits, 120)
        time.sleep(5)  # a late duplicate would arrive within the next alert tick
        runs = failed_runs(port)
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=90)
    total_s = time.monotonic() - started

    print(
        f"\nphases: healthy {first_phase_s:.0f} s, blocked {blocked_phase_s:.0f} s, "
        f"total {total_s:.0f} s"
    )
    for alert in Webhook.received:
        print(f"{alert['received_at'] - broken_at:+.0f} s  {alert['text']}")
    for run in runs:
        print("failed run:", run)

    assert process.returncode == 0, output
    left = wait_for_exit(children)
    assert not left, f"processes left running: {left}"
    after_break = [a for a in Webhook.received if a["received_at"] >= broken_at]
    assert [a["kind"] for a in after_break] == ["check_failed", "check_recovered"], after_break
    assert not [a for a in Webhook.received if a["kind"] == "run_failed"], Webhook.received
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


def _answers(port: int) -> bool:
    try:
        graphql(port, "{ version }")
    except OSError:
        return False
    return True


def wait_for_exit(pids: set[int], timeout_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [pid for pid in pids if is_running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left
