"""Signed models (models/signature.py): a directory or a GGUF signed with ``proctor model sign`` verifies with the
signer's public key; a tampered file fails naming itself; an unsigned model, or a signature without a key, is said
so; ``--require-model-signature`` refuses all but a verified one."""

from __future__ import annotations

from pathlib import Path

import pytest

from proctor.config import Settings
from proctor.models.errors import ModelError
from proctor.models.signature import (
    FAILED,
    UNSIGNED,
    UNVERIFIED,
    VERIFIED,
    check_signature,
    checked_signature,
    key_fingerprint,
    sign_model,
    signature_file,
)


def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    return model


@pytest.mark.parametrize("form", ["directory", "gguf"])
def test_a_signed_model_verifies_and_a_tampered_one_fails_naming_the_file(tmp_path: Path, form: str) -> None:
    if form == "directory":
        model, changed = model_dir(tmp_path), "model.safetensors"
        target = model / changed
    else:
        model = target = tmp_path / "tiny.gguf"
        model.write_bytes(b"GGUF" + bytes(range(256)) * 64)
        changed = "tiny.gguf"
    key = tmp_path / "signer.pem"
    signature, public = sign_model(model, key)
    assert signature == signature_file(model.resolve()) and signature.is_file() and public.is_file()
    found = check_signature(model, str(public))
    assert (found.status, found.signer) == (VERIFIED, key_fingerprint(public))
    data = bytearray(target.read_bytes())
    data[100] ^= 1
    target.write_bytes(bytes(data))
    failed = check_signature(model, str(public))
    assert failed.status == FAILED and changed in failed.detail and str(signature) in failed.detail
    other = tmp_path / "other.pem"
    sign_model(model_dir(tmp_path / "elsewhere"), other)  # another signer's key
    assert check_signature(model, str(tmp_path / "other.pem.pub")).status == FAILED


def test_unsigned_and_unchecked_models_are_said_so_and_required_signatures_refuse_them(tmp_path: Path) -> None:
    model = model_dir(tmp_path)
    assert check_signature(model, "").status == UNSIGNED
    with pytest.raises(ModelError, match="--require-model-signature: no model signature at"):
        checked_signature(Settings(require_model_signature=True), model)
    _, public = sign_model(model, tmp_path / "signer.pem")
    assert check_signature(model, "").status == UNVERIFIED
    with pytest.raises(ModelError, match="--model-signing-key"):
        checked_signature(Settings(require_model_signature=True), model)
    found = checked_signature(Settings(require_model_signature=True, model_signing_key=str(public)), model)
    assert found.status == VERIFIED
    assert checked_signature(Settings(), model).status == UNVERIFIED  # not required: recorded, not refused
