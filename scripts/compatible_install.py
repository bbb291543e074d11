"""Does the package install into a team's existing Dagster environment without changing it?

    .venv/bin/python scripts/compatible_install.py [--dagster 1.13.24] [--keep DIR]

Makes a fresh virtual environment, installs another Dagster 1.13 release there (``dagster``
and ``dagster-pyspark`` at ``--dagster`` and its paired library release), then asks pip to
install this project into it (``pip install --dry-run --report``: resolved, not installed) two
ways: plain, and with the environment's own versions as constraints (``pip freeze`` into
``-c``), pip's way of saying "keep what is installed". Prints what each would install and exits
1 when the constrained install would replace a Dagster package already there (or cannot
resolve). Needs PyPI; takes about two minutes.

Why plain ``pip install .`` may still move Dagster: the project needs Dagster libraries the
environment lacks (dagster-dbt, dagster-slack); pip picks their newest release in range, and
each library release pins its core release exactly, so core follows. The constrained install
picks the library releases paired with the installed core instead.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def library_release(dagster: str) -> str:
    """Dagster's libraries are numbered 0.(minor+16).patch beside core 1.minor.patch.

    Example:
        >>> library_release("1.13.24")
        '0.29.24'
    """
    major, minor, patch = (int(part) for part in dagster.split("."))
    assert major == 1
    return f"0.{minor + 16}.{patch}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dagster", default="1.13.24", help="the release already installed")
    parser.add_argument("--keep", help="make the environment here and keep it")
    args = parser.parse_args()
    home = Path(args.keep or tempfile.mkdtemp(prefix="compatible-install-"))
    python = home / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True)
    pip = [str(python), "-m", "pip", "--quiet", "--disable-pip-version-check"]
    existing = [f"dagster=={args.dagster}", f"dagster-pyspark=={library_release(args.dagster)}"]
    subprocess.run([*pip, "install", *existing], check=True)
    frozen = home / "environment.txt"
    frozen.write_text(
        subprocess.run([*pip, "freeze"], check=True, capture_output=True, text=True).stdout
    )
    print(f"environment: {', '.join(existing)}")
    outcome = {}
    for way, extra in (("plain", []), ("constrained", ["-c", str(frozen)])):
        report = home / f"report-{way}.json"
        subprocess.run(
            [*pip, "install", "--dry-run", "--report", str(report), *extra, str(ROOT)], check=True
        )
        planned = {
            item["metadata"]["name"].lower(): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]
        }
        moved = sorted(
            f"{name} -> {version}"
            for name, version in planned.items()
            if name in ("dagster", "dagster-pyspark")
        )
        outcome[way] = moved
        print(
            f"{way}: pip would install {len(planned)} packages; replaced Dagster: {moved or 'none'}"
        )
    return 1 if outcome["constrained"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
