"""The end of every test run's log: the suite's wall time and where the tests' time went.

pytest's ``--durations=25`` (pyproject.toml) prints the 25 slowest phases; this plugin adds, last,
the wall time of the session and the share of the tests' time spent in set-up, which is where the
servers start (a broker, MirrorMaker 2, Spark, the registry, a `make dev` stack: session and
module fixtures start them for their first user). Under pytest-xdist the controller receives
every worker's reports, so the sums cover the whole suite; their total exceeds the wall time by
the parallelism.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

SETUP_SHOWN = 5
"""How many of the longest set-ups the summary names."""


class SuiteReport:
    """Collects each phase's duration; prints the summary at the end of the session."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.phases: defaultdict[str, float] = defaultdict(float)
        self.setups: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.phases[report.when] += report.duration
        if report.when == "setup":
            self.setups[report.nodeid] += report.duration

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        wall = time.monotonic() - self.started
        total = sum(self.phases.values())
        setup = self.phases["setup"]
        share = setup / total if total else 0.0
        write = terminalreporter.write_line
        terminalreporter.section("suite time")
        write(f"wall time {wall:.1f} s ({wall / 60:.1f} min)")
        write(
            f"tests' time {total:.1f} s: set-up {setup:.1f} s ({share:.0%}, where the servers "
            f"start), call {self.phases['call']:.1f} s, teardown {self.phases['teardown']:.1f} s"
        )
        longest = sorted(self.setups.items(), key=lambda item: item[1], reverse=True)
        for nodeid, seconds in [item for item in longest[:SETUP_SHOWN] if item[1] >= 1.0]:
            write(f"  set-up {seconds:6.1f} s  {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    """Registered on the process that prints the summary (not on an xdist worker)."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(SuiteReport(), "suite-report")
