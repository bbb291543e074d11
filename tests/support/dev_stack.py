"""`make dev` (scripts/dev.py) as a child process, and how tests look at it: its process tree
(read from /proc) and the UI's GraphQL endpoint.

The tests that need `make dev` share one stack (:class:`DevStack`, the session fixture
``dev_stack`` in tests/conftest.py): starting it (broker, Spark Connect, ``dagster dev``, the
first stream commit) costs about half a minute on a 2-core machine, each time. They run at the
end of the session in :data:`DEV_STACK_ORDER` (:func:`order_dev_stack_users`): the freshness
target on the fresh stack, the alert procedure (it breaks the pipelines file and restores it),
a scrape of the metrics endpoint checked against the table and Kafka, then
tests/scripts/test_dev.py: no run failed while the demo ran (:func:`failed_runs`, a test's
deliberate failures aside: :attr:`DevStack.expected_failures`), then the test that stops the
stack and checks that Ctrl-C leaves nothing. A test that changes the stack restores it before it
ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from platform_assets.pipelines import PIPELINES_FILE
from resources.embedded import find_free_port
from tests.support.webhook import WebhookReceiver

ROOT = Path(__file__).resolve().parent.parent.parent
DEV_STACK_ORDER = ("test_freshness.py", "test_dev_alerts.py", "test_dev_metrics.py", "test_dev.py")
"""The modules using the shared stack, in the order they run (the last one stops it)."""


def start_dev_stack(
    state_dir: Path, port: int, env: dict[str, str] | None = None, rate: float = 50
) -> subprocess.Popen[str]:
    """Start scripts/dev.py (demo producer at ``rate`` records/s, 0: none) with its output on
    ``stdout``."""
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts" / "dev.py"),
            "--state-dir",
            str(state_dir),
            "--ui-port",
            str(port),
            "--rate",
            f"{rate:g}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@dataclass
class DevStack:
    """A running `make dev`: the shipped pipelines file copied to ``pipelines``
    (``PLATFORM_PIPELINES_FILE``), alerts to ``webhook``, the UI on ``port``.

    ``banner``: the lines dev.py prints once started (to the demo producer's); ``children``:
    its process tree once the UI answered (broker, Spark Connect, dagster dev and its webserver
    and daemon).
    """

    process: subprocess.Popen[str]
    state_dir: Path
    port: int
    pipelines: Path
    webhook: WebhookReceiver
    banner: str = ""
    children: set[Process] = field(default_factory=set)
    output: str | None = None  # what dev.py printed after the banner, once stopped
    expected_failures: set[str] = field(default_factory=set)
    """Ids of the runs a test failed on purpose (tests/scripts/test_dev_alerts.py: the blocked
    run)."""

    def stop(self) -> str:
        """Ctrl-C (SIGINT) and wait for dev.py to exit; return its remaining output."""
        if self.output is None:
            self.process.send_signal(signal.SIGINT)
            self.output, _ = self.process.communicate(timeout=90)
        return self.output


def launch_shared_stack(state_dir: Path, webhook: WebhookReceiver) -> DevStack:
    """Start `make dev` on a copy of the shipped pipelines file and wait for its UI."""
    state_dir.mkdir(parents=True, exist_ok=True)
    pipelines = state_dir / "pipelines.yaml"
    pipelines.write_text(PIPELINES_FILE.read_text())
    env = {
        **os.environ,
        "PLATFORM_PIPELINES_FILE": str(pipelines),
        "PLATFORM_ALERT_WEBHOOK_URL": webhook.url,
    }
    env.pop("PLATFORM_UI_BASE_URL", None)  # scripts/dev.py points it at its UI
    port = find_free_port()
    stack = DevStack(start_dev_stack(state_dir, port, env), state_dir, port, pipelines, webhook)
    try:
        assert stack.process.stdout is not None
        # The banner follows the demo catalog's reset and the start of every process.
        lines: list[str] = []
        while not lines or not lines[-1].startswith("Demo producer:"):
            line = stack.process.stdout.readline()
            if not line:
                break
            lines.append(line)
        stack.banner = "".join(lines)
        log = f"{state_dir}/logs/dagster.log"
        wait_for(f"a GraphQL answer (log: {log})", lambda: answers(port), 180, every_s=1)
        stack.children = descendants(stack.process.pid)
    except BaseException:
        stack.stop()
        raise
    return stack


def check_stopped_cleanly(stack: DevStack, grace_s: float = 20.0) -> None:
    """Stop the stack if it runs; assert that dev.py exited 0 and left no process running."""
    output = stack.stop()
    assert stack.process.returncode == 0, output
    assert "Stopped." in output, output
    left = wait_for_exit(stack.children, grace_s)
    assert not left, f"processes left running after Ctrl-C: {left}"


def order_dev_stack_users(items: list[pytest.Item]) -> None:
    """Move the tests using the ``dev_stack`` fixture to the end, in :data:`DEV_STACK_ORDER`
    (others first): the session fixture then stops the stack right after its last user."""
    users = [item for item in items if "dev_stack" in getattr(item, "fixturenames", ())]
    rank = {name: n for n, name in enumerate(DEV_STACK_ORDER)}
    unknown = sorted({item.path.name for item in users} - set(rank))
    if unknown:  # a renamed module would run in any order, maybe after the stack stopped
        raise pytest.UsageError(f"tests using dev_stack missing from DEV_STACK_ORDER: {unknown}")
    ordered = sorted(users, key=lambda item: rank.get(item.path.name, -1))
    items[:] = [item for item in items if item not in users] + ordered


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float, every_s: float = 2.0) -> Any:
    """Poll ``probe`` until it returns something true; return it, or fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def answers(port: int) -> bool:
    """Whether the UI answers GraphQL yet."""
    try:
        graphql(port, "{ version }")
    except OSError:
        return False
    return True


def wait_for_exit(processes: set[Process], timeout_s: float = 20.0) -> list[str]:
    """The ``processes`` still running after up to ``timeout_s``, described."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in processes if is_running(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [describe(p) for p in left]


def descendants(pid: int) -> set[Process]:
    """Every live process below ``pid`` (read from /proc), with its start time."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = fields
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, fields in stats.items() if int(fields[1]) in frontier}
        found |= frontier
    return {(child, int(stats[child][19])) for child in found}


Process = tuple[int, int]
"""A process as (pid, start time in clock ticks since boot): with ``pid_max`` 32768 a busy stack
reuses pids within minutes, and a reused pid is another process, not one left running."""


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def is_running(process: Process) -> bool:
    """Whether this very process (same pid and start time) still runs (a zombie does not)."""
    fields = _stat(process[0])
    return fields is not None and fields[0] != "Z" and int(fields[19]) == process[1]


def describe(process: Process) -> str:
    """A process and its command line, for a failure message."""
    try:
        command = Path(f"/proc/{process[0]}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        command = b"?"
    return f"{process[0]} ({command.decode(errors='replace')[:200].strip()})"


def graphql(port: int, query: str, timeout_s: float = 120.0) -> dict[str, object]:
    """POST one GraphQL query to the dev UI.

    The timeout is generous: *Reload definitions* starts a new code server (a Python process that
    imports Dagster and the definitions), which takes well over 5 s on a busy 2-core CI machine.
    """
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        result: dict[str, object] = json.loads(response.read())
        return result


def sensor_ticks(port: int, sensor: str) -> list[float]:
    """The start times (epoch seconds) of ``sensor``'s finished ticks in the dev UI, newest first:
    a test that asserts something did *not* happen waits for the ticks that would have done it."""
    answer = graphql(
        port,
        "{ workspaceOrError { ... on Workspace { locationEntries { locationOrLoadError { ... on "
        "RepositoryLocation { repositories { sensors { name sensorState { ticks(limit: 20) "
        "{ timestamp status } } } } } } } } } }",
    )
    entries = answer["data"]["workspaceOrError"]["locationEntries"]  # type: ignore[index]
    (found,) = [
        found
        for entry in entries
        for repository in (entry["locationOrLoadError"] or {}).get("repositories", [])
        for found in repository["sensors"]
        if found["name"] == sensor
    ]
    finished = ("SUCCESS", "SKIPPED", "FAILURE")
    return [t["timestamp"] for t in found["sensorState"]["ticks"] if t["status"] in finished]


def ticks_since(port: int, since: float, counts: dict[str, int]) -> bool:
    """Whether each sensor of ``counts`` has finished at least that many ticks since ``since``."""
    return all(
        len([t for t in sensor_ticks(port, name) if t >= since]) >= n for name, n in counts.items()
    )


RUN_FIELDS = (
    "runId jobName status startTime tags { key value } assetSelection { path } "
    "assetCheckSelection { name }"
)


def runs(port: int, status: str) -> list[dict[str, Any]]:
    """The runs with ``status`` (``FAILURE``, ``SUCCESS``, ...) in the dev UI, newest first."""
    answer = graphql(
        port,
        f"{{ runsOrError(filter: {{statuses: [{status}]}}) {{ ... on Runs {{ results "
        f"{{ {RUN_FIELDS} }} }} }} }}",
    )
    return answer["data"]["runsOrError"]["results"]  # type: ignore[index]


def failed_runs(port: int) -> list[dict[str, Any]]:
    """The failed runs, each with ``errors``: the messages of its step and run failures."""
    failed = runs(port, "FAILURE")
    for run in failed:
        answer = graphql(
            port,
            f'{{ logsForRun(runId: "{run["runId"]}") {{ ... on EventConnection {{ events '
            "{ __typename ... on ErrorEvent { error { message } } } } } }",
        )
        events = answer["data"]["logsForRun"]["events"]  # type: ignore[index]
        run["errors"] = [e["error"]["message"] for e in events if e.get("error")]
    return failed


def describe_run(run: dict[str, Any]) -> str:
    """One failed run for an assertion message: job, id, what it targeted and its errors."""
    assets = ", ".join("/".join(a["path"]) for a in run.get("assetSelection") or [])
    errors = dict.fromkeys(e.strip() for e in run.get("errors", []))  # step and run: often twice
    text = "\n".join(errors) or "(no error message)"
    return f"{run['jobName']} {run['runId']} [{assets}]:\n" + textwrap.indent(text, "    ")
