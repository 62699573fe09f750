"""The audit log on both stores: append-only, and every kind of tampering is found and located.

Each test builds a real log through the real sink (hash chain, Ed25519 checkpoints every 4
records, checkpoint file), then tampers with the database behind the store's back the way an
insider with database access would (triggers disabled first), and checks that ``verify_log``
fails naming the first bad sequence number. PostgreSQL runs when ``make test`` started it
(PROCTOR_TEST_POSTGRES_DSN); without it those cases skip with a message.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proctor.audit.chain import load_or_create_signing_key
from proctor.audit.sink import AuditSink
from proctor.audit.store import AuditStore, Filters
from proctor.audit.verify import verify_log

CHECKPOINT_EVERY = 4


def body(number: int, caller: str = "alice") -> dict[str, Any]:
    return {"format": "proctor.audit/1", "kind": "request", "audit_id": f"id-{number:04d}", "method": "Generate",
            "request_id": f"req-{number}", "received_ms": 1_764_000_000_000 + number, "caller": {"identity": caller},
            "status": {"code": "OK", "message": ""}, "finish": {"reason": "length", "detail": ""},
            "tokens": [{"step": 0, "id": 42, "text": "ok", "logprob": -0.5}]}


@dataclass
class Log:
    store: AuditStore
    key_path: Path
    checkpoints: Path
    execute: Callable[[str, tuple[object, ...]], None]  # raw SQL with the triggers disabled
    execute_as_owner: Callable[[str], None]  # raw SQL by the table's owner, triggers in place
    reopen: Callable[[], AuditStore]
    reopen_writer: Callable[[], AuditStore]

    def verify(self) -> Any:
        from proctor.audit.chain import load_public_key

        return verify_log(self.reopen(), public_key=load_public_key(str(self.key_path)),
                          checkpoint_file=self.checkpoints)


def fill(store: AuditStore, tmp_path: Path, records: int) -> tuple[Path, Path]:
    key_path, checkpoints = tmp_path / "audit.key", tmp_path / "audit.checkpoints"
    sink = AuditSink(store, load_or_create_signing_key(key_path), checkpoint_file=checkpoints,
                     checkpoint_every=CHECKPOINT_EVERY, checkpoint_interval_s=3600)
    futures = [sink.submit(body(i, caller="bob" if i % 3 == 0 else "alice")) for i in range(records)]
    assert [f.result(10) for f in futures] == sorted(f.result(10) for f in futures)
    sink.close()
    return key_path, checkpoints


def sqlite_log(tmp_path: Path, records: int) -> Log:
    from proctor.audit.sqlite_store import SQLiteAuditStore

    path = tmp_path / "audit.db"
    key_path, checkpoints = fill(SQLiteAuditStore(path), tmp_path, records)

    def execute(statement: str, params: tuple[object, ...]) -> None:
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("DROP TRIGGER IF EXISTS audit_log_no_update")
        db.execute("DROP TRIGGER IF EXISTS audit_log_no_delete")
        db.execute(statement, params)
        db.close()

    def as_owner(statement: str) -> None:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute(statement)
        finally:
            db.close()

    return Log(SQLiteAuditStore(path, readonly=True), key_path, checkpoints, execute, as_owner,
               lambda: SQLiteAuditStore(path, readonly=True), lambda: SQLiteAuditStore(path))


def postgres_log(tmp_path: Path, records: int) -> Log:
    psycopg = pytest.importorskip("psycopg")
    from helpers.postgres import audit_schema, postgres_dsn

    from proctor.audit.postgres_store import PostgresAuditStore

    owner = postgres_dsn()
    if owner is None:
        pytest.skip("PostgreSQL is not running (make test starts it; PROCTOR_TEST_POSTGRES_DSN)")
    owner_dsn, app_dsn = audit_schema(owner)
    key_path, checkpoints = fill(PostgresAuditStore(app_dsn), tmp_path, records)

    def execute(statement: str, params: tuple[object, ...]) -> None:
        with psycopg.connect(owner_dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE audit_log DISABLE TRIGGER USER")
            conn.execute(statement.replace("?", "%s"), params)

    def as_owner(statement: str) -> None:
        with psycopg.connect(owner_dsn, autocommit=True) as conn:
            conn.execute(statement)

    return Log(PostgresAuditStore(app_dsn), key_path, checkpoints, execute, as_owner,
               lambda: PostgresAuditStore(app_dsn),
               lambda: PostgresAuditStore(app_dsn))


STORES = {"sqlite": sqlite_log, "postgres": postgres_log}


@pytest.fixture(params=sorted(STORES))
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[int], Log]]:
    yield lambda records: STORES[request.param](tmp_path, records)


def test_an_intact_log_verifies_and_filters_work(make_log: Callable[[int], Log]) -> None:
    log = make_log(10)
    result = log.verify()
    assert result.ok, result.problem
    assert (result.records, result.checkpoints) == (10, 3)  # after 4, after 8, and the final one at close
    assert [r.audit_id for r in log.store.iterate(Filters(caller="bob"))] == ["id-0000", "id-0003", "id-0006",
                                                                             "id-0009"]
    assert log.store.get("id-0005").request_id == "req-5"  # type: ignore[union-attr]
    assert log.store.get("nope") is None


def test_the_store_refuses_update_and_delete(make_log: Callable[[int], Log]) -> None:
    """Even the table's owner, with full rights, is stopped by the triggers (and the server's
    PostgreSQL role has no UPDATE/DELETE rights at all)."""
    log = make_log(3)
    for statement in ("UPDATE audit_log SET caller = 'mallory' WHERE seq = 1", "DELETE FROM audit_log WHERE seq = 1"):
        with pytest.raises(Exception, match="append-only"):
            log.execute_as_owner(statement)
    store = log.reopen_writer()
    conn = getattr(store, "_conn", None)
    if conn is not None:  # PostgreSQL: the appender role
        for statement in ("UPDATE audit_log SET caller = 'mallory'", "DELETE FROM audit_log", "TRUNCATE audit_log"):
            with pytest.raises(Exception, match="permission denied"):
                conn.execute(statement)
            conn.rollback()
    assert log.verify().ok


def _seq_of(log: Log, audit_id: str) -> int:
    row = log.store.get(audit_id)
    assert row is not None
    return row.seq


TAMPERING = {
    # name: (how, which record must be named first)
    "flip a byte": (lambda log, k: log.execute("UPDATE audit_log SET body = ? WHERE seq = ?",
                                               (bytes(log.reopen().get("id-0005").body).replace(b"req-5", b"req-6"),  # type: ignore[union-attr]
                                                k)), 0),
    "delete a row": (lambda log, k: log.execute("DELETE FROM audit_log WHERE seq = ?", (k,)), 0),
    "delete and renumber": (lambda log, k: (log.execute("DELETE FROM audit_log WHERE seq = ?", (k,)),
                                            log.execute("UPDATE audit_log SET seq = seq - 1 WHERE seq > ?", (k,))), 0),
    "insert a row": (lambda log, k: (log.execute("UPDATE audit_log SET seq = seq + 1000 WHERE seq >= ?", (k,)),
                                     log.execute("UPDATE audit_log SET seq = seq - 999 WHERE seq >= ?", (k + 1000,)),
                                     log.execute(
                                         "INSERT INTO audit_log (seq, audit_id, kind, time_ms, caller, request_id, "
                                         "finish_reason, body, prev_hash, hash) SELECT ?, 'forged', kind, time_ms, "
                                         "caller, request_id, finish_reason, body, prev_hash, hash FROM audit_log "
                                         "WHERE seq = ?", (k, k + 1))), 0),
    "swap two rows": (lambda log, k: (log.execute("UPDATE audit_log SET seq = -1 WHERE seq = ?", (k,)),
                                      log.execute("UPDATE audit_log SET seq = ? WHERE seq = ?", (k, k + 1)),
                                      log.execute("UPDATE audit_log SET seq = ? WHERE seq = -1", (k + 1,))), 0),
    "edit a filter column": (lambda log, k: log.execute("UPDATE audit_log SET caller = 'mallory' WHERE seq = ?",
                                                        (k,)), 0),
}


@pytest.mark.parametrize("tampering", sorted(TAMPERING))
def test_tampering_is_found_at_the_first_bad_record(make_log: Callable[[int], Log], tampering: str) -> None:
    log = make_log(10)
    k = _seq_of(log, "id-0005")
    how, offset = TAMPERING[tampering]
    how(log, k)
    result = log.verify()
    assert not result.ok
    assert result.first_bad_seq == k + offset, (tampering, result)


def test_cutting_the_tail_past_the_last_checkpoint_is_found(make_log: Callable[[int], Log]) -> None:
    log = make_log(10)
    rows = list(log.reopen().iterate(None))
    last_checkpoint = max(r.seq for r in rows if r.kind == "checkpoint")
    cut = last_checkpoint - 2
    log.execute("DELETE FROM audit_log WHERE seq >= ?", (cut,))
    result = log.verify()
    assert not result.ok and result.first_bad_seq == cut
    assert "checkpoint" in result.problem


def test_a_forged_checkpoint_signature_is_found(make_log: Callable[[int], Log]) -> None:
    log = make_log(6)
    checkpoint = next(r for r in log.reopen().iterate(None) if r.kind == "checkpoint")
    forged = json.loads(checkpoint.body)
    forged["signature"] = forged["signature"][:-4] + ("AAAA" if not forged["signature"].endswith("AAAA") else "BBBB")
    from proctor.audit.chain import canonical, row_hash

    data = canonical(forged)  # a consistent row: only the signature can tell
    log.execute("UPDATE audit_log SET body = ?, hash = ? WHERE seq = ?",
                (data, row_hash(checkpoint.seq, checkpoint.prev_hash, data), checkpoint.seq))
    result = log.verify()
    assert not result.ok and result.first_bad_seq == checkpoint.seq


def test_two_servers_writing_to_one_store_keep_one_chain(make_log: Callable[[int], Log], tmp_path: Path) -> None:
    """Replicas share a PostgreSQL store (or two processes one SQLite file): the chain must not fork."""
    log = make_log(2)
    import threading

    store_a, store_b = log.reopen_writer(), log.reopen_writer()
    sinks = [AuditSink(store, load_or_create_signing_key(log.key_path), checkpoint_file=log.checkpoints,
                       checkpoint_every=CHECKPOINT_EVERY, checkpoint_interval_s=3600) for store in (store_a, store_b)]

    def write(sink: AuditSink, base: int) -> None:
        for number in range(base, base + 12):
            sink.submit(body(number)).result(10)

    threads = [threading.Thread(target=write, args=(sink, 100 * (i + 1))) for i, sink in enumerate(sinks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for sink in sinks:
        sink.close()
    result = log.verify()
    assert result.ok, result.problem
    assert result.records == 2 + 24
