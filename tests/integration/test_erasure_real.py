"""Erasure by crypto-shredding (issue 44, part 2), on SQLite and PostgreSQL, with the real model: with
``--audit-encryption subject`` each record's content is sealed under its subject's key; ``proctor audit erase``
destroys one subject's key and records it. Afterwards the log verifies, a proof handed out before still verifies
and a new one can be made, the subject's text cannot be read from the raw database even with every other key,
the other subject is untouched, and a replay is refused naming the erasure."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import grpc
import pytest
from test_receipts_real import store_settings

from proctor_client import ProctorClient, ProctorError

pytestmark = pytest.mark.real_model
SECRET = "Patient Zelda Quixotic-Hammersmith, born 1957"


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_erasing_a_subject_leaves_every_proof_valid_and_its_text_unreadable(
        kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from proctor.app import BackgroundServer
    from proctor.audit.chain import load_or_create_signing_key, log_signer
    from proctor.audit.keystore import FileKeyStore
    from proctor.audit.setup import key_dir, open_store, signing_key_path
    from proctor.audit.stored_body import record_json
    from proctor.audit.verify import verify_log
    from proctor.cli import main
    from proctor.config import Settings
    from proctor_client.tlog.proof import verify_proof

    settings = Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False, **store_settings(kind, tmp_path),
                              "audit_encryption": "subject"}, environ={})
    flags = ["--db", settings.audit_db] if kind == "sqlite" else ["--dsn", settings.audit_dsn]
    server = BackgroundServer(settings).start()
    try:
        with ProctorClient(server.address, timeout_s=120) as client:
            alice = client.generate(f"Summarise the file of {SECRET}.", max_new_tokens=4, subject_id="alice")
            bob = client.generate("Summarise the file of Bob.", max_new_tokens=4, subject_id="bob")
            client.create_checkpoint()
            before = client.inclusion_proof(alice.audit_id).tlog_proof
            vkey = log_signer(load_or_create_signing_key(signing_key_path(settings))).verifier.vkey()
            assert verify_proof(before, vkey).ok
            opened = json.loads(client.audit_record(alice.audit_id).record_json)
            assert SECRET in opened["request"]["prompt"] and opened["output"]["text"] == alice.text
            keys = FileKeyStore(key_dir(settings))
            subjects = {entry.subject: entry.key_id for entry in keys.entries()}
            bob_key = keys.key(subjects["bob"])
            assert set(subjects) == {"alice", "bob"} and bob_key is not None

            erase = ["audit", "erase", "--subject", "alice", "--reason", "GDPR request 42", "--operator", "dpo",
                     *flags, "--key-dir", str(key_dir(settings)), "--signing-key", str(signing_key_path(settings))]
            assert main(erase) == 0
            assert main(erase) == 1  # nothing left to erase

            erased = json.loads(client.audit_record(alice.audit_id).record_json)
            assert erased["erased"] and erased["output"] == {"policy": "erased"} and erased["request"] is None
            assert SECRET not in client.audit_record(alice.audit_id).record_json
            assert json.loads(client.audit_record(bob.audit_id).record_json)["output"]["text"] == bob.text
            with pytest.raises(ProctorError) as refused:
                client.replay(alice.audit_id)
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "erased by erasure record" in refused.value.message and "GDPR request 42" in refused.value.message
            assert client.replay(bob.audit_id).exact_match  # the other subject replays as before
            assert verify_proof(before, vkey).ok  # the proof handed out before the erasure
            after = client.inclusion_proof(alice.audit_id).tlog_proof
            assert verify_proof(after, vkey).ok
            assert client.verify_log().ok
    finally:
        server.stop()
    store = open_store(settings, readonly=True)
    assert verify_log(store, processes=1).ok
    row = store.get(alice.audit_id)
    assert row is not None
    raw = record_json(row.body)  # the raw database: the stored bytes inflated
    assert SECRET.encode() not in raw and alice.text.encode() not in raw
    sealed = json.loads(raw)["sealed"]
    with pytest.raises(InvalidTag):  # not even another subject's key opens it
        AESGCM(bob_key).decrypt(base64.b64decode(sealed["nonce"]), base64.b64decode(sealed["ciphertext"]),
                                alice.audit_id.encode())
    assert main(["audit", "show", alice.audit_id, *flags]) == 0  # the operator's view says so too
    shown = capsys.readouterr().out
    assert "erased (its subject's key is destroyed)" in shown and SECRET not in shown
    out = tmp_path / "erasures.jsonl"
    assert main(["audit", "export", *flags, "--kind", "erasure", "--out", str(out)]) == 0
    (record,) = [json.loads(line)["record"] for line in out.read_text(encoding="utf-8").splitlines()]
    assert (record["subject"], record["records"], record["reason"], record["caller"]["identity"]) == \
        ("alice", 1, "GDPR request 42", "dpo")
