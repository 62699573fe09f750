"""A signed model served (issue 44, part 5), with the default model's GGUF: signed with ``proctor model sign``, it
loads with ``--require-model-signature`` and GetModelInfo and every audit record name the signature and its signer;
with one byte of the file changed, the server does not start, and the error names the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from proctor_client import ProctorClient

pytestmark = pytest.mark.real_model


def test_a_signed_gguf_is_verified_recorded_and_a_tampered_one_refused(tmp_path: Path, default_gguf: Path) -> None:
    from proctor.app import BackgroundServer
    from proctor.cli import main
    from proctor.config import Settings
    from proctor.models.errors import ModelError
    from proctor.models.signature import key_fingerprint

    model = tmp_path / "served.gguf"
    shutil.copyfile(default_gguf, model)
    key = tmp_path / "release-team.pem"
    assert main(["model", "sign", str(model), "--key", str(key)]) == 0
    public = Path(f"{key}.pub")
    assert main(["model", "verify", str(model), "--public-key", str(public)]) == 0
    settings = Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False, "model": str(model),
                              "audit_db": str(tmp_path / "audit.db"), "model_signing_key": str(public),
                              "require_model_signature": True}, environ={})
    server = BackgroundServer(settings).start()
    try:
        with ProctorClient(server.address, timeout_s=120) as client:
            info = client.model_info()
            assert (info.model_signature, info.model_signer) == ("verified", key_fingerprint(public))
            answer = client.generate("Hello", max_new_tokens=2)
            record = json.loads(client.audit_record(answer.audit_id).record_json)
            assert record["model"]["model_signature"] == "verified"
            assert record["model"]["model_signer"] == info.model_signer
    finally:
        server.stop()

    with open(model, "r+b") as handle:  # one byte of the weights changed after signing
        handle.seek(model.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 1]))
    assert main(["model", "verify", str(model), "--public-key", str(public)]) == 1
    refused = BackgroundServer(settings)
    try:
        with pytest.raises(ModelError, match=r"--require-model-signature: .*served\.gguf"):
            refused.start()
    finally:
        refused.stop()
