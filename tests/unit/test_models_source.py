"""``settings.model`` resolves to the default model, a directory, a .gguf file or a hub id, or fails clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from proctor.config import DEFAULT_MODEL_NAME, Settings
from proctor.models.errors import ModelError
from proctor.models.loader import resolve_source


def _settings(tmp_path: Path, model: str = "") -> Settings:
    return Settings(model=model, model_store=tmp_path / "store")


def test_missing_default_model_says_run_make_setup(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="make setup"):
        resolve_source(_settings(tmp_path))


def test_installed_default_model_is_a_directory_source(tmp_path: Path) -> None:
    model_dir = tmp_path / "store" / DEFAULT_MODEL_NAME
    model_dir.mkdir(parents=True)
    for name in ("proctor-model.json", "config.json", "model.safetensors", "tokenizer.json"):
        (model_dir / name).write_text("{}")
    source = resolve_source(_settings(tmp_path))
    assert (source.kind, source.path, source.model_id) == ("dir", model_dir, DEFAULT_MODEL_NAME)


def test_half_written_default_model_is_not_installed(tmp_path: Path) -> None:
    model_dir = tmp_path / "store" / DEFAULT_MODEL_NAME
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")  # no marker: not installed
    with pytest.raises(ModelError, match="not installed"):
        resolve_source(_settings(tmp_path))


def test_directory_and_gguf_sources(tmp_path: Path) -> None:
    hf = tmp_path / "my-model"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert resolve_source(_settings(tmp_path, str(hf))).kind == "dir"
    assert resolve_source(_settings(tmp_path, str(hf))).model_id == "my-model"
    gguf = tmp_path / "tiny.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    source = resolve_source(_settings(tmp_path, str(gguf)))
    assert (source.kind, source.model_id) == ("gguf", "tiny.Q8_0")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p, "no config.json"),  # a directory that is not a model
        (lambda p: p / "missing.gguf", "does not exist"),
        (lambda p: p / "no" / "such" / "dir", "does not exist"),
        (lambda p: (p / "weights.bin").write_bytes(b"x") and p / "weights.bin", "neither"),
    ],
)
def test_bad_paths_are_clear_errors(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        resolve_source(_settings(tmp_path, str(make(tmp_path))))


def test_hub_ids_only_when_the_hub_is_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="hub ids are disabled"):
        resolve_source(_settings(tmp_path, "HuggingFaceTB/SmolLM2-135M-Instruct"))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    source = resolve_source(_settings(tmp_path, "HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert (source.kind, source.model_id) == ("hub", "HuggingFaceTB/SmolLM2-135M-Instruct")
