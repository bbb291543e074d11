"""An executor that kept another engine version across a deploy refuses its task.

The driver stamps the engine's fingerprint on each task; the executor (a separate Spark Python
worker here) compares it with the engine it imported. Tested through a real local Spark: the
driver's stamp is replaced, so the executors' real engine no longer matches."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ingestion import exceptions
from ingestion.health.state import commits_of
from ingestion.pipeline import execute
from ingestion.task import engine_version
from resources.spark import zip_engine_package
from tests.support.ledger import Ledger
from tests.support.pipelines import Harness, NewPipeline

pytestmark = pytest.mark.integration


def test_a_task_from_another_engine_version_fails_the_run_and_commits_nothing(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, spec = new_pipeline("engine_skew", partitions=2, produce=40)
    with monkeypatch.context() as patched:
        patched.setattr(execute, "engine_fingerprint", lambda: "f" * 64)
        with pytest.raises(exceptions.TaskFailedError) as failed:
            harness.run(spec)
    message = str(failed.value)
    assert "EngineMismatchError" in message or "runs engine" in message, message
    assert "driver engine ffffffffffff" in message
    assert "spark.ship_engine" in message
    assert commits_of(harness.table(spec), spec.consumer_group_id) == []  # nothing committed
    # The same run with matching versions ingests every record once.
    assert harness.run(spec).records == 40
    harness.assert_exactly_once(spec, ledger)


def test_the_shipped_zip_carries_the_fingerprint_of_the_source() -> None:
    """``spark.ship_engine`` sends a zip; a process importing the engine only from it computes
    the same fingerprint as this one (which imports the directory)."""
    archive = zip_engine_package()
    code = (
        "from ingestion.task.engine_version import engine_fingerprint; print(engine_fingerprint())"
    )
    found = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {archive!r}); {code}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert found == engine_version.engine_fingerprint()
