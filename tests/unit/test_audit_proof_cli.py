"""``proctor audit prove | public-key | verify-proof | show FILE | consistency`` and ``proctor-client
verify-proof`` on a real SQLite log written by the real sink: the round trip a compliance officer and
a counterparty make, and the exits and messages when something does not hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from proctor.audit import FORMAT
from proctor.audit.chain import load_or_create_signing_key
from proctor.audit.sink import AuditSink
from proctor.audit.sqlite_store import SQLiteAuditStore
from proctor.cli import main


@pytest.fixture
def log(tmp_path: Path) -> Path:
    db = tmp_path / "audit.db"
    sink = AuditSink(SQLiteAuditStore(db), load_or_create_signing_key(Path(f"{db}.key")),
                     checkpoint_file=Path(f"{db}.checkpoints"), checkpoint_every=4, checkpoint_interval_s=3600)
    for number in range(10):
        sink.submit({"format": FORMAT, "kind": "request", "audit_id": f"id-{number}", "method": "Generate",
                     "request_id": f"r{number}", "received_ms": 1_764_000_000_000 + number,
                     "caller": {"identity": "alice", "source": "open"}, "finish": {"reason": "length", "detail": ""},
                     "status": {"code": "OK", "message": ""}, "model": {"model_id": "m"},
                     "usage": {"prompt_tokens": 3, "completion_tokens": 1},
                     "tokens": [{"step": 0, "id": 42, "text": "ok", "logprob": -0.5}]}).result(10)
    sink.close()
    return db


def test_prove_then_verify_offline_then_show(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from proctor_client.cli import main as client_main

    assert main(["audit", "public-key", "--db", str(log)]) == 0
    vkey = capsys.readouterr().out.strip()
    assert vkey.startswith("proctor.audit/") and vkey.count("+") >= 2
    proof = tmp_path / "id-6.tlog-proof"
    assert main(["audit", "prove", "id-6", "--db", str(log), "--out", str(proof)]) == 0
    text = proof.read_text()
    assert text.startswith("c2sp.org/tlog-proof@v1\nextra ") and "\nindex 7\n" in text and "\n\u2014 " in text
    capsys.readouterr()
    assert main(["audit", "verify-proof", str(proof), "--public-key", vkey]) == 0
    out = capsys.readouterr().out
    assert "VERIFIED" in out and "FAIL" not in out and "id-6" in out
    assert client_main(["verify-proof", str(proof), "--public-key", vkey]) == 0  # the client package alone
    capsys.readouterr()
    assert main(["audit", "show", str(proof)]) == 0
    assert "audit id   id-6  (record 8" in capsys.readouterr().out

    lines = text.split("\n")
    index = lines.index("index 7") + 1
    lines[index] = ("B" if lines[index][0] != "B" else "C") + lines[index][1:]
    forged = tmp_path / "forged.tlog-proof"
    forged.write_text("\n".join(lines))
    assert main(["audit", "verify-proof", str(forged), "--public-key", vkey]) == 1
    assert "NOT VERIFIED: the inclusion check failed" in capsys.readouterr().out


def test_what_cannot_be_proved_is_said(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "prove", "nope", "--db", str(log), "--out", str(tmp_path / "x")]) == 1
    assert "no audit record 'nope'" in capsys.readouterr().err
    assert main(["audit", "prove", "id-1", "--db", str(log), "--checkpoint", "3", "--out", "-"]) == 1
    assert "no signed checkpoint for tree size 3" in capsys.readouterr().err
    assert main(["audit", "prove", "id-8", "--db", str(log), "--checkpoint", "4", "--out", "-"]) == 1
    assert "checkpoint covers 4 rows" in capsys.readouterr().err
    assert main(["audit", "prove", "id-1", "--db", str(log), "--checkpoint", "4", "--out", "-"]) == 0
    assert "\n4\n" in capsys.readouterr().out


def test_consistency_between_signed_checkpoints(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "consistency", "--db", str(log), "--from", "4", "--to", "9", "--verify"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.split()) >= 1 and "consistent: the signed checkpoint of 4 rows" in captured.err
    assert main(["audit", "consistency", "--db", str(log), "--from", "9", "--to", "4"]) == 1
    assert "from <= to" in capsys.readouterr().err
    assert main(["audit", "consistency", "--db", str(log), "--from", "3", "--to", "9", "--verify"]) == 1
    assert "no signed checkpoint for tree size 3" in capsys.readouterr().err
