"""Missing model, data, service or package: a skip on a developer's machine, a failure under CI (``CI=true``).

The one place tests turn a missing requirement into a skip: every such check goes through ``missing``
or ``require_module``, so CI never passes by skipping what it should have run.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

BENCHDATA = Path(__file__).resolve().parents[3] / "shared" / "benchdata"


def missing(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail with it when running under CI (the data must be there)."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (required under CI)")
    pytest.skip(reason, allow_module_level=True)


def hardware_lacks(reason: str) -> NoReturn:
    """Skip, under CI too: a path only some CPUs have (VNNI) cannot be installed, and the run must say it was not
    checked here ("skipped: no VNNI here") rather than pass."""
    pytest.skip(reason)


def require_module(name: str, reason: str = "") -> Any:
    """``importlib.import_module(name)``, or ``missing`` when it is not installed."""
    try:
        module: ModuleType = importlib.import_module(name)
    except ImportError as exc:
        missing(reason or f"the package providing {name!r} is not installed ({exc})")
    return module
