"""How long ``platform status`` takes on a running ``make dev``, with and without ``--audit``.

    .venv/bin/python bench/status.py [--repeats 3] [--pipeline orders] [--full-audit]

Path: beside a running ``make dev``, it runs ``.venv/bin/platform --output json status`` as a
subprocess ``--repeats`` times in each mode, the modes taking turns (so a change of the machine's
load falls on both alike): the default (the audit's last verdict read from the Dagster
instance), ``--audit`` (the budgeted incremental audit, recounting Kafka now) and, with
``--full-audit``, the full audit. It reads the settings the CLI reads: the environment
(``KAFKA_BOOTSTRAP_SERVERS``, ``DAGSTER_HOME``, ``PLATFORM_CONFIG``, ...), completed from the
``.env`` that ``make dev`` writes in the repository root (python-dotenv; a variable already set
wins).

Printed per mode: the wall seconds of the command (median and max), and the largest
``last_commit_age_s`` it printed (a stream commits every few seconds: an age much larger than
that is an age taken before a slow audit). It judges nothing: performance lives here, never in
timed tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODES = {"default": [], "--audit": ["--audit"], "--full-audit": ["--full-audit"]}
TIMEOUT_S = 1800.0  # a full audit of a large table takes minutes; a hung command, not forever


@dataclass
class Timings:
    """One mode's runs: wall seconds, and the largest last-commit age each printed."""

    seconds: list[float] = field(default_factory=list)
    last_commit_ages_s: list[float] = field(default_factory=list)

    def describe(self, mode: str) -> str:
        """One line of the report.

        Example:
            >>> Timings([3.1, 2.9, 3.4], [1.2, 3.0]).describe("default")
            'default       3 runs: median 3.1 s, max 3.4 s; last commit printed at most 3.0 s ago'
        """
        ages = (
            f"; last commit printed at most {max(self.last_commit_ages_s):.1f} s ago"
            if self.last_commit_ages_s
            else "; no commit yet"
        )
        return (
            f"{mode:<13} {len(self.seconds)} runs: median {statistics.median(self.seconds):.1f} "
            f"s, max {max(self.seconds):.1f} s{ages}"
        )


def load_settings() -> dict[str, str]:
    """The environment the CLI runs in: this one, completed from the repository root's ``.env``
    (written by ``make dev`` while it runs) without overriding a variable already set."""
    from dotenv import load_dotenv

    dotenv = ROOT / ".env"
    if dotenv.is_file():
        load_dotenv(dotenv, override=False)
    if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS") and not os.environ.get("PLATFORM_CONFIG"):
        raise SystemExit(
            "bench/status.py: no KAFKA_BOOTSTRAP_SERVERS nor PLATFORM_CONFIG, and no .env of "
            "make dev in the repository root: start `make dev` first (or export them)"
        )
    return dict(os.environ)


def platform_command() -> list[str]:
    """``.venv/bin/platform``, else the ``platform`` beside this interpreter."""
    installed = ROOT / ".venv" / "bin" / "platform"
    return [str(installed if installed.exists() else Path(sys.executable).with_name("platform"))]


def time_status(command: list[str], env: dict[str, str]) -> tuple[float, list[float]]:
    """Run ``command`` once: its wall seconds and the last-commit ages it printed."""
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(
            f"bench/status.py: {' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    statuses = json.loads(done.stdout)
    ages = [s["last_commit_age_s"] for s in statuses if s["last_commit_age_s"] is not None]
    return seconds, ages


def main() -> None:
    """Time ``platform status`` in each mode, the modes taking turns; print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode (default: 3)")
    parser.add_argument("--pipeline", default=None, help="one pipeline (default: all)")
    parser.add_argument(
        "--full-audit", action="store_true", help="time --full-audit too (minutes on a big table)"
    )
    args = parser.parse_args()
    env = load_settings()
    modes = [mode for mode in MODES if mode != "--full-audit" or args.full_audit]
    base = [*platform_command(), "--output", "json", "status"]
    base += [args.pipeline] if args.pipeline else []
    timings = {mode: Timings() for mode in modes}
    for repeat in range(args.repeats):
        for mode in modes:
            seconds, ages = time_status([*base, *MODES[mode]], env)
            timings[mode].seconds.append(seconds)
            timings[mode].last_commit_ages_s += ages
            print(f"run {repeat + 1}/{args.repeats} {mode}: {seconds:.1f} s", flush=True)
    print(f"platform status beside make dev ({args.pipeline or 'every pipeline'}):")
    for mode in modes:
        print("  " + timings[mode].describe(mode))


if __name__ == "__main__":
    main()
