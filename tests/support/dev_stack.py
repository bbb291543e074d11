"""`make dev` (scripts/dev.py) as a child process, and how tests look at it: its process tree
(read from /proc) and the UI's GraphQL endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def start_dev_stack(
    state_dir: Path, port: int, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start scripts/dev.py (demo producer at 50 records/s) with its output on ``stdout``."""
    return subprocess.Popen(
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


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (read from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def is_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


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
