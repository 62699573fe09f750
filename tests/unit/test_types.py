"""The server package passes ``mypy --strict`` (configured in pyproject.toml): typed seams between modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_server_package_passes_the_strict_type_check() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_the_check_is_strict_and_covers_the_server() -> None:
    """Guard: a configuration that checked nothing, or leniently, would pass the test above."""
    config = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "strict = true" in config and 'files = ["service/proctor"]' in config

