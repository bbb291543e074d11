"""scripts/compatible_install.py, run as documented: another Dagster 1.13 release is installed
in a fresh environment, and installing the project with that environment's versions as
constraints keeps it (docs/production.md). Needs PyPI, as ``make`` does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_project_installs_into_another_dagster_1_13_without_changing_it(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "scripts/compatible_install.py", "--keep", str(tmp_path / "env")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "environment: dagster==1.13.24, dagster-pyspark==0.29.24" in done.stdout
    assert "constrained: pip would install" in done.stdout
    assert "replaced Dagster: none" in done.stdout.split("constrained:")[1]
