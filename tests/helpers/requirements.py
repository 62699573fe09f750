"""Missing model or benchmark data: a skip on a developer's machine, a failure under CI (``CI=true``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

BENCHDATA = Path(__file__).resolve().parents[3] / "shared" / "benchdata"


def missing(reason: str) -> None:
    """Skip with ``reason``, or fail with it when running under CI (the data must be there)."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (required under CI)")
    pytest.skip(reason)
