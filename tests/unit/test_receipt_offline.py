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
    note = fast.sign(fast.receipt("id-8", body, Committed(8, receipt.leaf_hash, 5), "answer"))
    checked = verify_receipt(note, signer.verifier, audit_id="id-8", output="answer")
    assert checked.index == 7 and checked.time_ms == 5
    assert checked.request_sha256 == hashlib.sha256(b'{"prompt":"Hello","sampling":{"seed":"3"}}').hexdigest()
    with pytest.raises(ValueError, match="its own key"):
        ReceiptSigner(Signer("proctor.audit/other", signer.key)).sign(receipt)


def test_receipts_committed_together_share_one_signature_and_each_verifies_alone(signer: Signer) -> None:
    """A group of receipts signed once (a Merkle tree of their texts, a signed group note): each verifies on its own
    with the log's key, as the server's libsodium signer writes it byte for byte; an edited receipt, or one moved
    to another place of the group, fails."""
    from proctor.audit.receipts import ReceiptSigner
    from proctor_client.tlog.receipt import sign_receipts

    receipts = [Receipt(ORIGIN, index, hashlib.sha256(bytes([index])).digest(), 1000 + index, f"id-{index}",
                        "0" * 64, output_digest(f"answer {index}")) for index in range(5)]
    notes = sign_receipts(receipts, signer)
    assert notes == ReceiptSigner(signer).sign_all(receipts)
    assert len({note.rsplit("\n\n", 1)[1] for note in notes}) == 1  # one signature line for the group
    for index, note in enumerate(notes):
        checked = verify_receipt(note, signer.verifier, audit_id=f"id-{index}", output=f"answer {index}")
        assert checked == receipts[index]
    edited = notes[2].replace("id-2", "id-7")
    moved = notes[2].replace("group 2 5", "group 3 5")
    for forged in (edited, moved):
        with pytest.raises(ReceiptError) as caught:
            verify_receipt(forged, signer.verifier)
        assert caught.value.check == "signature"
    with pytest.raises(ReceiptError) as wrong:
        verify_receipt(notes[0], Signer(ORIGIN, Ed25519PrivateKey.generate()).verifier)
    assert wrong.value.check == "signature"
    assert sign_receipts(receipts[:1], signer) == [sign_receipt(receipts[0], signer)]  # a lone one: a plain note


def test_the_group_tree_is_rfc_9162s_at_every_size() -> None:
    """Every leaf of groups of 1 to 40 receipts proves into the root with the RFC 9162 verifier (which knows
    nothing of how the tree was built), so the level-by-level tree is MTH's."""
    from proctor_client.tlog.merkle import leaf_hash, verify_inclusion
    from proctor_client.tlog.receipt import tree_levels, tree_path

    for size in range(1, 41):
        leaves = [leaf_hash(bytes([size, index])) for index in range(size)]
        levels = tree_levels(leaves)
        for index in range(size):
            verify_inclusion(index, size, leaves[index], tree_path(index, levels), levels[-1][0])
