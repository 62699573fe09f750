"""Legal holds and retention (issue 44, part 3), on SQLite and PostgreSQL, with the real sink, key store and sealing:
a sweep at a fake clock destroys exactly the keys past retention; a hold (on a subject, a caller or a time range)
keeps them and refuses an erasure naming itself; a release lets both run; holds, releases and erasures are records
of the log, which still verifies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers.requirements import missing, require_module

from proctor.audit import FORMAT
from proctor.audit.erasure import NothingToErase, erase, opened_json
from proctor.audit.holds import DAY_MS, Held, active_holds, day_of, hold_body, release
from proctor.audit.keystore import FileKeyStore
from proctor.audit.retention import RetentionPolicy, expired_day, sweep
from proctor.audit.sealing import seal
from proctor.audit.sink import AuditSink
from proctor.audit.store import AuditStore, Filters
from proctor.audit.verify import verify_log

NOW_MS = 1_796_000_000_000  # the fake clock: 2026-11-29 (UTC)


def open_store(kind: str, tmp_path: Path) -> AuditStore:
    if kind == "sqlite":
        from proctor.audit.sqlite_store import SQLiteAuditStore

        return SQLiteAuditStore(tmp_path / "audit.db")
    require_module("psycopg")
    from helpers.postgres import audit_schema, postgres_dsn

    from proctor.audit.postgres_store import PostgresAuditStore

    owner = postgres_dsn()
    if owner is None:
        missing("PostgreSQL is not running (make test starts it; PROCTOR_TEST_POSTGRES_DSN)")
    return PostgresAuditStore(audit_schema(owner)[1])


@dataclass
class Log:
    store: AuditStore
    sink: AuditSink
    keys: FileKeyStore

    def append(self, body: dict[str, Any]) -> str:
        self.sink.submit(body).result(10)
        return str(body["audit_id"])

    def record(self, number: int, subject: str, caller: str, days_ago: int) -> str:
        """A sealed request record of ``subject`` by ``caller`` that arrived ``days_ago`` days before NOW_MS."""
        received = NOW_MS - days_ago * DAY_MS
        audit_id = f"id-{number}"
        body = {"format": FORMAT, "kind": "request", "audit_id": audit_id, "request_id": f"r{number}",
                "received_ms": received, "caller": {"identity": caller}, "status": {"code": "OK"},
                "finish": {"reason": "length", "detail": ""}, "request": {"prompt": f"secret of {subject}"},
                "output": {"policy": "full", "text": f"answer {number}"}, "tokens": []}
        key_id, key = self.keys.key_for(subject, day_of(received), caller)
        return self.append(seal(body, key_id, key))

    def readable(self, audit_id: str) -> bool:
        row = self.store.get(audit_id)
        assert row is not None
        return "erased" not in json.loads(opened_json(row, self.keys))


@pytest.fixture(params=["sqlite", "postgres"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Log]:
    store = open_store(request.param, tmp_path)
    sink = AuditSink(store, Ed25519PrivateKey.generate(), checkpoint_file=None, checkpoint_every=4)
    yield Log(store, sink, FileKeyStore(tmp_path / "keys"))
    sink.close()


def test_a_sweep_destroys_exactly_the_keys_past_retention(log: Log) -> None:
    old = [log.record(1, "alice", "svc", 30), log.record(2, "bob", "svc", 8)]
    recent = [log.record(3, "alice", "svc", 7), log.record(4, "bob", "svc", 0)]
    assert expired_day(NOW_MS, 7) == day_of(NOW_MS - 8 * DAY_MS)  # 8 days ago: every record of that day is older
    done = sweep(log.store, log.keys, RetentionPolicy(7), NOW_MS, "test", log.append)
    assert done.records == 2 and len(done.key_ids) == 2 and done.held == ()
    assert [log.readable(audit_id) for audit_id in old + recent] == [False, False, True, True]
    (erasure,) = [json.loads(row.record_json()) for row in log.store.iterate(Filters(kind="erasure"))]
    assert erasure["records"] == 2 and erasure["reason"].startswith("retention: 7 days")
    again = sweep(log.store, log.keys, RetentionPolicy(7), NOW_MS, "test", log.append)
    assert again.key_ids == ()  # nothing more is due
    log.sink.close()
    assert verify_log(log.store, processes=1).ok


def test_periods_per_subject_and_per_caller_override_the_default(log: Log, tmp_path: Path) -> None:
    """A retention file: a subject's period wins, else the longest of the callers' whose records a key seals (0:
    for ever), else the default."""
    policy_file = tmp_path / "retention.yaml"
    policy_file.write_text("subjects: {carol: 3}\ncallers: {billing: 400, archive: 0}\n")
    policy = RetentionPolicy.load(30, str(policy_file))
    ids = {"default past": log.record(1, "alice", "svc", 40), "default kept": log.record(2, "bob", "svc", 20),
           "subject past": log.record(3, "carol", "billing", 5), "caller kept": log.record(4, "dave", "billing", 40),
           "caller for ever": log.record(5, "erin", "archive", 900)}
    done = sweep(log.store, log.keys, policy, NOW_MS, "test", log.append)
    assert done.records == 2
    assert {name: log.readable(audit_id) for name, audit_id in ids.items()} == {
        "default past": False, "default kept": True, "subject past": False, "caller kept": True,
        "caller for ever": True}
    policy_file.write_text("callers: {billing: -1}\n")
    with pytest.raises(ValueError, match="whole days >= 0"):
        RetentionPolicy.load(30, str(policy_file))


@pytest.mark.parametrize("scope", [{"subject": "alice"}, {"caller": "legal-svc"}, "range"])
def test_a_hold_keeps_what_it_covers_refuses_erasure_and_a_release_lets_both_run(log: Log, scope: Any) -> None:
    held_id = log.record(1, "alice", "legal-svc", 30)
    free_id = log.record(2, "bob", "svc", 20)
    if scope == "range":  # the records of 31 to 29 days ago
        scope = {"from_ms": NOW_MS - 31 * DAY_MS, "to_ms": NOW_MS - 29 * DAY_MS}
    hold_id = log.append(hold_body(scope, "case 2026-117", "counsel"))
    assert [hold.hold_id for hold in active_holds(log.store)] == [hold_id]
    done = sweep(log.store, log.keys, RetentionPolicy(7), NOW_MS, "test", log.append)
    assert len(done.held) == 1 and done.records == 1
    assert log.readable(held_id) and not log.readable(free_id)
    with pytest.raises(Held, match=f"under hold {hold_id} .*case 2026-117"):
        erase(log.store, log.keys, "alice", "GDPR request", "dpo", log.append)
    assert log.readable(held_id)  # a refused erasure destroys nothing
    release(log.store, hold_id, "case closed", "counsel", log.append)
    assert active_holds(log.store) == []
    erased = erase(log.store, log.keys, "alice", "GDPR request", "dpo", log.append)
    assert erased.records == 1 and not log.readable(held_id)
    with pytest.raises(NothingToErase):
        erase(log.store, log.keys, "alice", "again", "dpo", log.append)
    with pytest.raises(LookupError, match="no hold"):
        release(log.store, hold_id, "twice", "counsel", log.append)
    kinds = [row.kind for row in log.store.iterate(Filters(include_checkpoints=True))]
    assert {"hold", "release", "erasure"} <= set(kinds)
    log.sink.close()
    assert verify_log(log.store, processes=1).ok


def test_a_hold_names_one_scope() -> None:
    with pytest.raises(ValueError, match="one subject, one caller, or one time range"):
        hold_body({"subject": "a", "caller": "b"}, "x", "y")
    with pytest.raises(ValueError, match="ends after it starts"):
        hold_body({"from_ms": 5, "to_ms": 5}, "x", "y")


def test_the_commands_hold_release_erase_and_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``proctor audit hold | erase | release | sweep`` on a SQLite log, as an operator (or a CronJob) runs them."""
    import time

    from proctor.audit.chain import load_or_create_signing_key
    from proctor.audit.sqlite_store import SQLiteAuditStore
    from proctor.cli import main

    db, key = tmp_path / "audit.db", tmp_path / "audit.db.key"
    sink = AuditSink(SQLiteAuditStore(db), load_or_create_signing_key(key), checkpoint_file=None)
    log = Log(sink.store, sink, FileKeyStore(tmp_path / "audit.db.keys"))
    days_ago = int((time.time() * 1000 - NOW_MS) / DAY_MS)  # records 40 and 1 days before today, by the real clock
    old, recent = log.record(1, "carol", "svc", 40 - days_ago), log.record(2, "carol", "svc", 1 - days_ago)
    sink.close()
    flags = ["--db", str(db), "--operator", "dpo"]
    assert main(["audit", "hold", "--subject", "carol", "--reason", "case 9", *flags]) == 0
    hold_id = capsys.readouterr().out.strip()
    assert hold_id.startswith("hold-")
    assert main(["audit", "erase", "--subject", "carol", "--reason", "GDPR", *flags]) == 1
    assert f"under hold {hold_id}" in capsys.readouterr().err
    assert main(["audit", "sweep", "--retention-days", "30", *flags]) == 0
    assert "0 keys destroyed (0 records), 1 kept by holds" in capsys.readouterr().err
    assert main(["audit", "release", hold_id, "--reason", "case closed", *flags]) == 0
    assert main(["audit", "sweep", "--retention-days", "30", *flags]) == 0
    assert "1 keys destroyed (1 records), 0 kept by holds" in capsys.readouterr().err
    store = SQLiteAuditStore(db, readonly=True)
    keys = FileKeyStore(tmp_path / "audit.db.keys")
    assert [log.readable(audit_id) for log in [Log(store, sink, keys)] for audit_id in (old, recent)] == [False, True]
    assert main(["audit", "erase", "--subject", "carol", "--reason", "GDPR", *flags]) == 0
    assert verify_log(SQLiteAuditStore(db, readonly=True), processes=1).ok
