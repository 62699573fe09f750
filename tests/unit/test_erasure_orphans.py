"""Erase and sweep walk the key files, not only the key store's index (issue 54, part 2), on SQLite and PostgreSQL:
a key the index lost is destroyed with its subject's others and reported; one an older version made (no entry file)
is named by the records it sealed; one that sealed nothing is left and reported; a hold on a lost key's caller
still keeps it from the sweep."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_audit_retention import NOW_MS, Log, open_store

from proctor.audit import FORMAT
from proctor.audit.erasure import erase, recovered_note
from proctor.audit.holds import DAY_MS, day_of, hold_body, release
from proctor.audit.keystore import FileKeyStore
from proctor.audit.retention import RetentionPolicy, sweep
from proctor.audit.sealing import seal
from proctor.audit.sink import AuditSink
from proctor.audit.verify import verify_log


@pytest.fixture(params=["sqlite", "postgres"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Log]:
    store = open_store(request.param, tmp_path)
    sink = AuditSink(store, Ed25519PrivateKey.generate(), checkpoint_file=None, checkpoint_every=4)
    yield Log(store, sink, FileKeyStore(tmp_path / "keys"))
    sink.close()


def lose(keys: FileKeyStore, key_id: str, *, entry_file: bool = True) -> None:
    """Drop ``key_id`` from the index as an unlocked writer could (and, ``entry_file`` False, its entry file: a key
    an older version made)."""
    index_file = keys.directory / "keys.json"
    index = json.loads(index_file.read_text())
    del index[key_id]
    index_file.write_text(json.dumps(index))
    if not entry_file:
        (keys.directory / f"{key_id}.entry").unlink()


def sealed_record(log: Log, number: int, subject_id: str, caller: str, key_id: str, key: bytes) -> str:
    """A request record naming ``subject_id`` (as a request's ``subject_id`` does), sealed under ``key_id``."""
    body: dict[str, Any] = {
        "format": FORMAT, "kind": "request", "audit_id": f"id-{number}", "request_id": f"r{number}",
        "received_ms": NOW_MS - 40 * DAY_MS, "caller": {"identity": caller}, "status": {"code": "OK"},
        "finish": {"reason": "length", "detail": ""}, "request": {"prompt": "secret", "subject_id": subject_id},
        "output": {"policy": "full", "text": f"answer {number}"}, "tokens": []}
    return log.append(seal(body, key_id, key))


def test_erase_destroys_a_key_the_index_lost_and_says_so(log: Log) -> None:
    first = log.record(1, "alice", "svc", 30)
    second = log.record(2, "alice", "svc", 2)
    bob = log.record(3, "bob", "svc", 2)
    (lost,) = [e.key_id for e in log.keys.entries() if e.subject == "alice" and e.day == day_of(NOW_MS - 30 * DAY_MS)]
    lose(log.keys, lost)
    done = erase(log.store, log.keys, "alice", "GDPR", "dpo", log.append)
    assert lost in done.key_ids and len(done.key_ids) == 2 and done.records == 2
    assert [entry.key_id for entry in done.recovered.entries] == [lost]
    assert "1 orphaned keys (missing from the key index) found and put back, 1 of them this subject's" in \
        recovered_note(done.recovered, "alice")
    assert [log.readable(audit_id) for audit_id in (first, second, bob)] == [False, False, True]
    assert not list(log.keys.directory.glob(f"{lost}.*"))
    log.sink.close()
    assert verify_log(log.store, processes=1).ok


def test_a_key_an_older_version_made_is_named_by_the_records_it_sealed(log: Log) -> None:
    key_id, key = secrets.token_hex(16), secrets.token_bytes(32)
    (log.keys.directory / f"{key_id}.key").write_bytes(key)  # the old layout: a key file and, lost, no entry
    carol = sealed_record(log, 1, "carol", "svc", key_id, key)
    idle = secrets.token_hex(16)
    (log.keys.directory / f"{idle}.key").write_bytes(secrets.token_bytes(32))  # sealed nothing
    log.record(2, "bob", "svc", 2)
    done = erase(log.store, log.keys, "carol", "GDPR", "dpo", log.append)
    assert done.key_ids == (key_id,) and done.records == 1 and not log.readable(carol)
    assert [(e.subject, e.day, e.callers) for e in done.recovered.entries] == \
        [("carol", day_of(NOW_MS - 40 * DAY_MS), ("svc",))]
    assert done.recovered.unattributed == (idle,)
    assert f"seal no record of this log and name no subject: left in place ({idle})" in recovered_note(done.recovered)
    assert (log.keys.directory / f"{idle}.key").exists()
    asked: list[list[str]] = []
    again = log.keys.recover(lambda key_ids: asked.append(list(key_ids)) or {})
    assert again.unattributed == (idle,) and asked == []  # the log is read for it once a process, not every sweep
    assert FileKeyStore(log.keys.directory).recover(lambda key_ids: asked.append(list(key_ids)) or {}).entries == ()
    assert asked == [[idle]]


@pytest.mark.parametrize("entry_file", [True, False], ids=["entry file", "older version"])
def test_a_sweep_finds_a_lost_key_and_a_hold_on_its_caller_still_keeps_it(log: Log, entry_file: bool) -> None:
    held = log.record(1, "erin", "billing", 30)
    (key_id,) = [entry.key_id for entry in log.keys.entries()]
    log.keys.key_for("erin", day_of(NOW_MS - 30 * DAY_MS), "svc")  # a second caller, in the entry file
    lose(log.keys, key_id, entry_file=entry_file)
    hold_id = log.append(hold_body({"caller": "billing"}, "case 7", "counsel"))
    done = sweep(log.store, log.keys, RetentionPolicy(7), NOW_MS, "test", log.append)
    assert done.held == (key_id,) and done.key_ids == () and log.readable(held)
    assert [(entry.key_id, "billing" in entry.callers) for entry in done.recovered.entries] == [(key_id, True)]
    release(log.store, hold_id, "closed", "counsel", log.append)
    done = sweep(log.store, log.keys, RetentionPolicy(7), NOW_MS, "test", log.append)
    assert done.key_ids == (key_id,) and done.recovered.entries == () and not log.readable(held)


def test_the_erase_and_sweep_commands_report_the_orphans_they_found(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from proctor.audit.chain import load_or_create_signing_key
    from proctor.audit.sqlite_store import SQLiteAuditStore
    from proctor.cli import main

    db = tmp_path / "audit.db"
    sink = AuditSink(SQLiteAuditStore(db), load_or_create_signing_key(tmp_path / "audit.db.key"), checkpoint_file=None)
    log = Log(sink.store, sink, FileKeyStore(tmp_path / "audit.db.keys"))
    days_ago = int((time.time() * 1000 - NOW_MS) / DAY_MS)  # by the real clock: 40 days ago, and today
    carol, dave = log.record(1, "carol", "svc", 40 - days_ago), log.record(2, "dave", "svc", -days_ago)
    for entry in log.keys.entries():
        lose(log.keys, entry.key_id)
    sink.close()
    flags = ["--db", str(db), "--operator", "dpo"]
    assert main(["audit", "sweep", "--retention-days", "30", *flags]) == 0
    assert "1 keys destroyed (1 records), 0 kept by holds; erasure record erasure-" in (err := capsys.readouterr().err)
    assert "2 orphaned keys (missing from the key index) found and put back" in err
    assert main(["audit", "erase", "--subject", "dave", "--reason", "GDPR", *flags]) == 0
    assert "erased subject 'dave': 1 keys destroyed, 1 records unreadable" in (err := capsys.readouterr().err)
    assert "orphaned" not in err  # put back by the sweep
    keys = FileKeyStore(tmp_path / "audit.db.keys")
    assert keys.entries() == [] and not list(keys.directory.glob("*.key"))
    assert not Log(SQLiteAuditStore(db, readonly=True), sink, keys).readable(carol)
    assert not Log(SQLiteAuditStore(db, readonly=True), sink, keys).readable(dave)
