"""The end of every test run's log: the suite's wall time and where the tests' time went.

pytest's ``--durations=25`` (pyproject.toml) prints the 25 slowest phases; this plugin adds, last,
the wall time of the session, the share of the tests' time spent in set-up, which is where the
servers start (a broker, MirrorMaker 2, Spark, the registry, a `make dev` stack: session and
module fixtures start them for their first user), and the CPU-seconds each group of tests
(``tests.support.suite_order.group_of``) cost. Under pytest-xdist the controller receives every
worker's reports, so the sums cover the whole suite; their total exceeds the wall time by the
parallelism.

The CPU figures: on the two cores the suite is CPU-bound once its workers keep both busy, so a
group's CPU-seconds, not its duration, are what it takes from the others. Each test phase's
report carries the CPU its process and its reaped child processes (the servers a fixture started
and stopped, the subprocesses a test ran) spent since the previous phase (``getrusage``). A
server still running at the session's end (a session fixture's broker) is counted by no group;
the summary says how much the whole run spent.
"""

from __future__ import annotations

import resource
import time
from collections import defaultdict
from collections.abc import Generator

import pytest

from tests.support.suite_order import group_of

SETUP_SHOWN = 5
"""How many of the longest set-ups the summary names."""
CPU_FIELD = "cpu_s"
"""The report attribute that carries a phase's CPU-seconds (a report's extra attributes travel
from an xdist worker to the controller with it)."""
GROUPS_SHOWN = 10
"""How many of the groups that cost the most CPU the summary names."""


def cpu_seconds() -> float:
    """User and system CPU of this process and of its reaped children, so far."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CpuMeter:
    """On the process that runs the tests: each phase's report gets :data:`CPU_FIELD`, the CPU spent
    since the previous report (xdist carries a report's attributes to the controller)."""

    def __init__(self) -> None:
        self.last = cpu_seconds()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self,
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        now = cpu_seconds()
        setattr(report, CPU_FIELD, round(now - self.last, 3))
        self.last = now
        return report


class SuiteReport:
    """Collects each phase's duration and CPU; prints the summary at the end of the session."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.cpu_at_start = cpu_seconds()
        self.phases: defaultdict[str, float] = defaultdict(float)
        self.setups: defaultdict[str, float] = defaultdict(float)
        self.cpu: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.phases[report.when] += report.duration
        self.cpu[group_of(report.nodeid)] += float(getattr(report, CPU_FIELD, 0.0))
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
        counted = sum(self.cpu.values())
        whole = cpu_seconds() - self.cpu_at_start  # the workers are reaped children by now
        write(
            f"CPU {counted:.1f} s counted by the tests' groups ({counted / wall:.2f} cores over "
            f"the wall time); the whole run, servers stopped at its end included: {whole:.1f} s"
        )
        costly = sorted(self.cpu.items(), key=lambda item: item[1], reverse=True)
        for group, seconds in costly[:GROUPS_SHOWN]:
            write(f"  cpu {seconds:7.1f} s  {group}")


def pytest_configure(config: pytest.Config) -> None:
    """The CPU meter where the tests run (an xdist worker, or the one process); the summary on
    the process that prints it (not on an xdist worker)."""
    if not getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        config.pluginmanager.register(CpuMeter(), "suite-cpu-meter")
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(SuiteReport(), "suite-report")
