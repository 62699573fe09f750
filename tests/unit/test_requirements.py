"""The suite's requirement helper (helpers/requirements.py): a missing model is a skip on a developer's machine
and a failure under CI, so CI never passes by skipping what it should have run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEEDS_THE_MODEL = "tests/unit/test_models_default.py"  # skips or fails as a whole module when the model is missing


def run_with_store(store: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    env["PROCTOR_MODEL_STORE"] = str(store)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", NEEDS_THE_MODEL],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_an_empty_model_store_fails_under_ci_and_skips_elsewhere(tmp_path: Path) -> None:
    under_ci = run_with_store(tmp_path, ci=True)
    assert under_ci.returncode != 0, under_ci.stdout[-2000:]
    assert "required under CI" in under_ci.stdout
    elsewhere = run_with_store(tmp_path, ci=False)
    assert elsewhere.returncode in (0, 5), elsewhere.stdout[-2000:]  # 5: the module was skipped whole
    assert "1 skipped" in elsewhere.stdout and "failed" not in elsewhere.stdout
