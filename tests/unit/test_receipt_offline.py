"""Receipts checked offline (proctor_client.tlog.receipt, ``proctor-client verify-receipt``): a receipt verifies with
the log's key; a flipped byte, another key, another record or another output fails, naming the check."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proctor_client.tlog.note import Signer
from proctor_client.tlog.receipt import (
    Receipt,
    ReceiptError,
    output_digest,
    parse_receipt,
    sign_receipt,
    verify_receipt,
)

ORIGIN = "proctor.audit/test"


def signed(signer: Signer, output: str = '{"ok": true}') -> str:
    receipt = Receipt(ORIGIN, 41, hashlib.sha256(b"leaf").digest(), 1_765_000_000_000, "0193abc",
                      hashlib.sha256(b"request").hexdigest(), output_digest(output))
    return sign_receipt(receipt, signer)


@pytest.fixture
def signer() -> Signer:
    return Signer(ORIGIN, Ed25519PrivateKey.generate())


def test_a_receipt_verifies_with_the_logs_key_and_says_what_it_is_for(signer: Signer) -> None:
    note = signed(signer)
    receipt = verify_receipt(note, signer.verifier, audit_id="0193abc", output='{"ok": true}')
    assert (receipt.index, receipt.audit_id, receipt.time_ms) == (41, "0193abc", 1_765_000_000_000)
    assert parse_receipt(receipt.text()) == receipt


def test_each_tampering_fails_naming_its_check(signer: Signer) -> None:
    note = signed(signer)
    flipped = note.replace("\n41\n", "\n42\n")  # another position, same signature
    checks = {}
    for name, attempt in {
        "flipped": lambda: verify_receipt(flipped, signer.verifier),
        "wrong key": lambda: verify_receipt(note, Signer(ORIGIN, Ed25519PrivateKey.generate()).verifier),
        "other log": lambda: verify_receipt(note, Signer("proctor.audit/other", signer.key).verifier),
        "other record": lambda: verify_receipt(note, signer.verifier, audit_id="0193abd"),
        "other output": lambda: verify_receipt(note, signer.verifier, output='{"ok": false}'),
        "not a receipt": lambda: verify_receipt(note.replace("proctor receipt v1", "proctor receipt v9"),
                                                signer.verifier),
    }.items():
        with pytest.raises(ReceiptError) as caught:
            attempt()
        checks[name] = caught.value.check
    assert checks == {"flipped": "signature", "wrong key": "signature", "other log": "origin",
                      "other record": "record", "other output": "output", "not a receipt": "format"}


def test_the_command_checks_a_receipt_file_and_names_the_failed_check(signer: Signer, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from proctor_client.cli import main

    receipt, output, key = tmp_path / "r.receipt", tmp_path / "out.json", tmp_path / "log.vkey"
    receipt.write_text(signed(signer), encoding="utf-8")
    output.write_text('{"ok": true}', encoding="utf-8")
    key.write_text(signer.verifier.vkey(), encoding="utf-8")
    assert main(["verify-receipt", str(receipt), "--public-key", str(key), "--audit-id", "0193abc",
                 "--output-file", str(output)]) == 0
    assert "VERIFIED: record 0193abc at index 41" in capsys.readouterr().out
    output.write_text('{"ok": false}', encoding="utf-8")
    assert main(["verify-receipt", str(receipt), "--public-key", str(key), "--output-file", str(output)]) == 1
    assert "the output check failed" in capsys.readouterr().out


def test_the_server_signs_receipts_with_libsodium_byte_for_byte_as_the_note_signer(signer: Signer) -> None:
    """audit/receipts.py signs with PyNaCl (it lets go of the GIL): Ed25519 is deterministic, so its note is the very
    one ``sign_receipt`` writes with the same key, and verifies with the log's key."""
    from proctor.audit.receipts import ReceiptSigner
    from proctor.audit.sink import Committed

    receipt = Receipt(ORIGIN, 7, hashlib.sha256(b"leaf").digest(), 1, "id-8", "0" * 64, output_digest("x"))
    fast = ReceiptSigner(signer)
    assert fast.sign(receipt) == sign_receipt(receipt, signer)
    body = {"request": {"prompt": "Hello", "sampling": {"seed": "3"}}}
    note = fast.receipt("id-8", body, Committed(8, receipt.leaf_hash, 5), "answer")
    checked = verify_receipt(note, signer.verifier, audit_id="id-8", output="answer")
    assert checked.index == 7 and checked.time_ms == 5
    assert checked.request_sha256 == hashlib.sha256(b'{"prompt":"Hello","sampling":{"seed":"3"}}').hexdigest()
    with pytest.raises(ValueError, match="its own key"):
        ReceiptSigner(Signer("proctor.audit/other", signer.key)).sign(receipt)
