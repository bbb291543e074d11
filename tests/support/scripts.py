"""The hand-run scripts under scripts/ (scripts, not package modules), loaded for tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str, module_name: str | None = None) -> ModuleType:
    """``scripts/<name>.py`` as a module, registered in ``sys.modules`` under ``module_name``
    (default: ``name``) unless one is already: its dataclasses, and scripts that import it as
    a module beside them, look it up there."""
    module_name = module_name or name
    spec = importlib.util.spec_from_file_location(module_name, SCRIPTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(module_name, module)
    spec.loader.exec_module(module)
    return module
