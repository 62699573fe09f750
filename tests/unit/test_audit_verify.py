"""The verifier: its read-ahead (a store error reaches the caller; stopping early at a tampered row
ends the reading thread and closes the store's scan before ``verify_log`` returns), and logs the
``proctor.audit/1`` and ``/2`` writers wrote (``data/audit_v1_log.jsonl``, ``data/audit_v2_log.jsonl``:
rows as that code stored them), continued by today's writer."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proctor.audit import FORMAT, verify
from proctor.audit.chain import GENESIS, row_hash
from proctor.audit.sink import AuditSink
from proctor.audit.sqlite_store import SQLiteAuditStore
from proctor.audit.store import COLUMNS, RawRow
from proctor.audit.stored_body import is_compressed
from proctor.audit.verify import verify_log
from proctor_client.tlog.note import load_public_key


def _rows(count: int) -> list[RawRow]:
    rows: list[RawRow] = []
    prev = GENESIS
    for seq in range(1, count + 1):
        body = b'{"n":%d}' % seq
        digest = row_hash(seq, prev, "request", f"id-{seq}", seq, "alice", f"r{seq}", "length", body)
        rows.append((seq, f"id-{seq}", "request", seq, "alice", f"r{seq}", "length", body, prev, digest))
        prev = digest
    return rows


class PagedStore:
    """A store that serves ``rows`` and can fail once asked for a row past ``fail_from``."""

    def __init__(self, rows: list[RawRow], fail_from: int | None = None) -> None:
        self.rows, self.fail_from = rows, fail_from
        self.threads: set[str] = set()
        self.reading = 0
        self.lock = threading.Lock()

    def tree_size(self) -> None:  # a log from before the Merkle tree (its checks are test_audit_store's)
        return None

    def tree_leaves(self, first: int, count: int) -> list[bytes]:
        return []

    def read_page(self, first_seq: int, limit: int) -> list[RawRow]:
        with self.lock:
            self.reading += 1
        try:
            self.threads.add(threading.current_thread().name)
            if self.fail_from is not None and first_seq >= self.fail_from:
                raise RuntimeError("the store went away")
            time.sleep(0.001)
            return [row for row in self.rows if row[0] >= first_seq][:limit]
        finally:
            with self.lock:
                self.reading -= 1


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify, "PAGE_ROWS", 2)


def test_an_intact_log_is_read_by_other_threads() -> None:
    store = PagedStore(_rows(7))
    result = verify_log(store)  # type: ignore[arg-type]
    assert result.ok and result.records == 7
    assert store.threads and threading.current_thread().name not in store.threads


def test_rows_appended_while_verifying_are_read_in_order() -> None:
    """A page read ahead before the rows it asks for exist comes back empty; the rows written since
    are still read after the short page, so the chain has no hole."""
    rows = _rows(12)
    store = PagedStore(rows[:5])
    plain_read = store.read_page

    def growing(first_seq: int, limit: int) -> list[RawRow]:
        page = plain_read(first_seq, limit)
        if first_seq == 5:  # the log grows once the page that ends it ([5]) was read
            store.rows = rows
        return page

    store.read_page = growing  # type: ignore[method-assign]
    result = verify_log(store)  # type: ignore[arg-type]
    assert result.ok and result.records == 12, result


def test_a_store_error_reaches_the_caller() -> None:
    store = PagedStore(_rows(7), fail_from=5)
    with pytest.raises(RuntimeError, match="went away"):
        verify_log(store)  # type: ignore[arg-type]
    assert store.reading == 0


def test_stopping_at_a_tampered_row_ends_the_reading_threads() -> None:
    rows = _rows(9)
    seq, audit_id, kind, time_ms, _, request_id, finish, body, prev, digest = rows[2]
    rows[2] = (seq, audit_id, kind, time_ms, "mallory", request_id, finish, body, prev, digest)
    store = PagedStore(rows)
    before = threading.active_count()
    result = verify_log(store)  # type: ignore[arg-type]
    assert not result.ok and result.first_bad_seq == 3 and "modified" in result.problem
    assert store.reading == 0 and threading.active_count() == before


DATA = Path(__file__).parent / "data"
PUBLIC_KEYS = {  # the keys that signed the fixtures' checkpoints
    "v1": "NCzRY5lZWrmRkOc9LQTBGrEdts+gA+p87+vZRIWjUnE=",
    "v2": "An3Px2Q1HcDQ+Yb+R/6Bzz2Svhc5KqNtKZct0Z5ZIVU=",
}


def _old_fixture(tmp_path: Path, version: str) -> tuple[Path, Path]:
    """A log an older writer wrote (10 records, a checkpoint every 4, callers with quotes and
    non-ASCII, floats JCS writes differently from Python) loaded row for row into a new store."""
    path, checkpoints = tmp_path / "audit.db", tmp_path / "audit.checkpoints"
    SQLiteAuditStore(path).close()
    db = sqlite3.connect(path, isolation_level=None)
    for line in (DATA / f"audit_{version}_log.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        db.execute(f"INSERT INTO audit_log ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   [row[c] if c != "body" else row[c].encode("utf-8") for c in COLUMNS.split(", ")])
    db.close()
    shutil.copy(DATA / f"audit_{version}_log.checkpoints", checkpoints)
    return path, checkpoints


@pytest.mark.parametrize("version", sorted(PUBLIC_KEYS))
def test_a_log_written_by_an_older_writer_verifies_and_continues(tmp_path: Path, version: str) -> None:
    path, checkpoints = _old_fixture(tmp_path, version)
    result = verify_log(SQLiteAuditStore(path, readonly=True), public_key=load_public_key(PUBLIC_KEYS[version]),
                        checkpoint_file=checkpoints)
    assert result.ok and (result.records, result.checkpoints, result.tree_leaves) == (10, 3, 0), result
    sink = AuditSink(SQLiteAuditStore(path), Ed25519PrivateKey.generate(), checkpoint_file=checkpoints,
                     checkpoint_every=4, checkpoint_interval_s=3600)
    for number in range(10):
        sink.submit({"format": FORMAT, "kind": "request", "audit_id": f"new{number}", "request_id": f"n{number}",
                     "received_ms": 2000 + number, "caller": {"identity": 'caller "q" é'}, "finish": None}).result(10)
    sink.close()
    result = verify_log(SQLiteAuditStore(path, readonly=True), checkpoint_file=checkpoints)  # keys as named
    assert result.ok and (result.records, result.checkpoints) == (20, 6), result
    assert result.tree_leaves == 26  # the writer grew the tree over the old rows before its own
    store = SQLiteAuditStore(path, readonly=True)
    formats = [json.loads(row.record_json())["format"] for row in store.iterate(None)]
    assert formats == [f"proctor.audit/{version[1]}"] * 13 + [FORMAT] * 13
    assert not any(is_compressed(row.body) for row in store.iterate(None) if row.seq <= 13)


@pytest.mark.parametrize("version", sorted(PUBLIC_KEYS))
@pytest.mark.parametrize(("statement", "bad_seq"), [
    ("UPDATE audit_log SET caller = 'mallory' WHERE seq = 3", 3),
    ("UPDATE audit_log SET body = CAST(replace(body, 'r7', 'r8') AS BLOB) WHERE seq = 9", 9),
    ("DELETE FROM audit_log WHERE seq = 6", 6),
    ("DELETE FROM audit_log WHERE seq >= 12", 12),  # the tail, its last checkpoint included
])
def test_tampering_with_an_older_log_is_still_found(tmp_path: Path, statement: str, bad_seq: int,
                                                   version: str) -> None:
    path, checkpoints = _old_fixture(tmp_path, version)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("DROP TRIGGER audit_log_no_update")
    db.execute("DROP TRIGGER audit_log_no_delete")
    db.execute(statement)
    db.close()
    result = verify_log(SQLiteAuditStore(path, readonly=True), public_key=load_public_key(PUBLIC_KEYS[version]),
                        checkpoint_file=checkpoints)
    assert not result.ok and result.first_bad_seq == bad_seq, result
