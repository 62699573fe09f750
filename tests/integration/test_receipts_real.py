"""Receipts end to end, on SQLite and PostgreSQL, with the real model: every answer (unary, the stream's last chunk,
each of n samples) carries the log's receipt; it verifies offline with the published key and the answered text;
``proctor audit prove --from-receipt`` turns it into an inclusion proof once a checkpoint covers the record (with
``--addr`` it asks the server for that checkpoint), and refuses a receipt whose leaf the log does not hold."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.requirements import missing, require_module

from proctor_client import ProctorClient

pytestmark = pytest.mark.real_model


def store_settings(kind: str, tmp_path: Path) -> dict[str, object]:
    if kind == "sqlite":
        return {"audit_db": str(tmp_path / "audit.db")}
    require_module("psycopg")
    from helpers.postgres import audit_schema, postgres_dsn

    owner = postgres_dsn()
    if owner is None:
        missing("PostgreSQL is not running (make test starts it; PROCTOR_TEST_POSTGRES_DSN)")
    _, dsn = audit_schema(owner)
    return {"audit_dsn": dsn, "audit_signing_key": str(tmp_path / "log.key"),
            "audit_checkpoint_file": str(tmp_path / "log.checkpoints"),
            "audit_key_dir": str(tmp_path / "keys")}  # not the default beside the working directory: one per test


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_every_answer_carries_a_receipt_that_verifies_offline_and_proves_its_record(
        kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from proctor.app import BackgroundServer
    from proctor.audit.chain import load_or_create_signing_key, log_signer
    from proctor.cli import main
    from proctor.config import Settings
    from proctor_client.tlog.note import parse_note
    from proctor_client.tlog.proof import verify_proof
    from proctor_client.tlog.receipt import ReceiptError, parse_receipt, sign_receipt, verify_receipt

    stored = store_settings(kind, tmp_path)
    settings = Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False, **stored,
                              "audit_checkpoint_every": 1000, "audit_checkpoint_interval_s": 3600})
    key_path = Path(settings.audit_signing_key or f"{settings.audit_db}.key")
    store_flags = ["--db", str(stored["audit_db"])] if kind == "sqlite" else ["--dsn", str(stored["audit_dsn"])]
    server = BackgroundServer(settings).start()
    try:
        with ProctorClient(server.address, timeout_s=120) as client:
            unary = client.generate("Decision:", choice=["approve", "reject"], max_new_tokens=4)
            chunks = list(client.stream_generate("Count to three:", max_new_tokens=6))
            samples = client.generate("Pick a colour:", max_new_tokens=4, temperature=0.9, seed=3,
                                      num_return_sequences=2)
            signer = log_signer(load_or_create_signing_key(key_path), settings.audit_origin)
            verifier = signer.verifier
            receipt = verify_receipt(unary.receipt, verifier, audit_id=unary.audit_id, output=unary.text)
            streamed = verify_receipt(chunks[-1].receipt, verifier, audit_id=chunks[-1].audit_id,
                                      output="".join(chunk.text for chunk in chunks))
            assert all(not chunk.receipt for chunk in chunks[:-1])  # the last chunk only
            for sequence in samples.sequences:  # each completion its own record, its own receipt
                verify_receipt(sequence.receipt, verifier, audit_id=sequence.audit_id, output=sequence.text)
            assert len({s.audit_id for s in samples.sequences}) == 2 and receipt.index < streamed.index
            with pytest.raises(ReceiptError) as caught:
                verify_receipt(unary.receipt, verifier, output=unary.text + " ")
            assert caught.value.check == "output"

            (tmp_path / "unary.receipt").write_text(unary.receipt, encoding="utf-8")
            out = tmp_path / "unary.tlog-proof"
            prove = ["audit", "prove", *store_flags, "--from-receipt", str(tmp_path / "unary.receipt"), "--out",
                     str(out)]
            assert main(prove) == 1  # no checkpoint covers it yet (one an hour, 1000 records)
            assert "--addr" in capsys.readouterr().err
            assert main([*prove, "--addr", server.address]) == 0
            report = verify_proof(out.read_text(encoding="utf-8"), verifier.vkey())
            assert report.ok, report.failed
            assert report.record is not None and report.record["audit_id"] == unary.audit_id

            forged = dataclasses.replace(parse_receipt(parse_note(unary.receipt).text), leaf_hash=bytes(32))
            (tmp_path / "forged.receipt").write_text(sign_receipt(forged, signer), encoding="utf-8")
            capsys.readouterr()
            assert main(["audit", "prove", *store_flags, "--from-receipt", str(tmp_path / "forged.receipt"),
                         "--out", str(tmp_path / "forged.tlog-proof")]) == 1
            assert "does not hold what it signed" in capsys.readouterr().err
    finally:
        server.stop()


def test_without_receipts_answers_do_not_wait_and_carry_none(tmp_path: Path) -> None:
    from proctor.app import BackgroundServer
    from proctor.config import Settings

    settings = Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False, "audit_db": str(tmp_path / "a.db"),
                              "audit_receipts": False, "audit_compliance": False})
    server = BackgroundServer(settings).start()
    try:
        with ProctorClient(server.address, timeout_s=120) as client:
            answer = client.generate("Hello", max_new_tokens=2)
        assert answer.audit_id and answer.receipt == ""
    finally:
        server.stop()
