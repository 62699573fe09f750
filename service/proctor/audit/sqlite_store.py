"""The SQLite audit store: WAL, ``synchronous=FULL`` (checked at open), UPDATE/DELETE refused by triggers."""

from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from proctor.audit import tree
from proctor.audit.chain import GENESIS
from proctor.audit.store import COLUMNS, Build, Filters, RawRow, Row, filter_sql
from proctor.audit.store import row_from_columns as _row

READ_MMAP_BYTES = 1 << 40  # SQLite caps it at its compile-time maximum (SQLITE_MAX_MMAP_SIZE)
SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_log (
    seq INTEGER PRIMARY KEY,
    audit_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    time_ms INTEGER NOT NULL,
    caller TEXT NOT NULL,
    request_id TEXT NOT NULL,
    finish_reason TEXT NOT NULL,
    body BLOB NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_log_audit_id ON audit_log (audit_id);
CREATE INDEX IF NOT EXISTS audit_log_time ON audit_log (time_ms);
CREATE INDEX IF NOT EXISTS audit_log_caller ON audit_log (caller, time_ms);
CREATE INDEX IF NOT EXISTS audit_log_request ON audit_log (request_id);
CREATE TRIGGER IF NOT EXISTS audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: UPDATE refused'); END;
CREATE TRIGGER IF NOT EXISTS audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: DELETE refused'); END;
CREATE TABLE IF NOT EXISTS audit_tree_nodes (
    id INTEGER PRIMARY KEY,
    hash BLOB NOT NULL
);
CREATE TRIGGER IF NOT EXISTS audit_tree_nodes_no_update BEFORE UPDATE ON audit_tree_nodes
BEGIN SELECT RAISE(ABORT, 'the audit tree is append-only: UPDATE refused'); END;
CREATE TRIGGER IF NOT EXISTS audit_tree_nodes_no_delete BEFORE DELETE ON audit_tree_nodes
BEGIN SELECT RAISE(ABORT, 'the audit tree is append-only: DELETE refused'); END;
CREATE TABLE IF NOT EXISTS audit_cosignatures (
    tree_size INTEGER NOT NULL,
    witness TEXT NOT NULL,
    line TEXT NOT NULL,
    time_ms INTEGER NOT NULL,
    PRIMARY KEY (tree_size, witness)
);
CREATE TRIGGER IF NOT EXISTS audit_cosignatures_no_update BEFORE UPDATE ON audit_cosignatures
BEGIN SELECT RAISE(ABORT, 'the audit cosignatures are append-only: UPDATE refused'); END;
CREATE TRIGGER IF NOT EXISTS audit_cosignatures_no_delete BEFORE DELETE ON audit_cosignatures
BEGIN SELECT RAISE(ABORT, 'the audit cosignatures are append-only: DELETE refused'); END;
"""


class SQLiteAuditStore:
    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self.description = f"sqlite:{path}"
        if readonly:
            if not path.exists():
                raise FileNotFoundError(f"no audit database at {path}")
            self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
            # Reads from the mapped file instead of a read() per page: a third less CPU for verify's
            # scan of ~30 KB bodies. Read-only connections only (export, verify): an I/O error on a
            # mapped file is a signal, not an exception, and the server's writer must not die of one.
            self._db.execute(f"PRAGMA mmap_size={READ_MMAP_BYTES}")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            mode = self._db.execute("PRAGMA journal_mode").fetchone()[0]
            sync = self._db.execute("PRAGMA synchronous").fetchone()[0]
            if mode.lower() != "wal" or sync != 2:
                raise RuntimeError(f"{path}: SQLite refused WAL/synchronous=FULL (got {mode}, {sync}); "
                                   "the audit log needs durable commits")
            self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def append_chained(self, build: Build) -> list[Row]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")  # the write lock: other processes wait
            try:
                head = self._db.execute("SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1").fetchone()
                head_seq, head_hash = head if head else (0, GENESIS)
                compact = tree.open_range(self._fetch, head_seq, "?", COLUMNS)
                rows = build(head_seq, head_hash, compact)
                for row in rows[compact.size - head_seq:]:  # leaves the build did not append itself
                    compact.append(tree.row_leaf_hash(row))
                self._db.executemany(
                    f"INSERT INTO audit_log ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(r.seq, r.audit_id, r.kind, r.time_ms, r.caller, r.request_id, r.finish_reason, r.body,
                      r.prev_hash, r.hash) for r in rows])
                self._db.executemany(tree.insert_sql("?"), tree.stored(compact.nodes))
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        return rows

    def append_leaves(self, start: int, leaves: list[bytes]) -> int:
        """Append leaf hashes for rows already in the log (the first-start build, ``audit/tree_build.py``), in
        one write transaction, only if the tree has exactly ``start`` leaves; returns its size after."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                size = tree.leaves_for(tree.node_count(self._fetch))
                if size == start:
                    compact = tree.open_range(self._fetch, start, "?", COLUMNS)
                    compact.extend(leaves)
                    self._db.executemany(tree.insert_sql("?"), tree.stored(compact.nodes))
                    size = compact.size
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        return size

    def tree_size(self) -> int | None:
        with self._lock:
            try:
                return tree.leaves_for(tree.node_count(self._fetch))
            except sqlite3.OperationalError:  # opened read-only, from before the tree: no tree table
                if self._db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (tree.TABLE,)).fetchone():
                    raise
                return None

    def tree_nodes(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        with self._lock:
            return tree.fetch_nodes(self._fetch, keys, "?")

    def tree_leaves(self, first: int, count: int) -> list[bytes]:
        with self._lock:
            return tree.fetch_leaves(self._fetch, first, count, "?")

    def tree_span(self, first_id: int, last_id: int) -> list[tuple[int, bytes]]:
        with self._lock:
            return tree.fetch_span(self._fetch, first_id, last_id, "?")

    def add_cosignature(self, tree_size: int, witness: str, line: str, time_ms: int) -> bool:
        """Keep a witness's cosignature of the checkpoint of ``tree_size`` (False: it had one already)."""
        with self._lock:
            cursor = self._db.execute("INSERT OR IGNORE INTO audit_cosignatures (tree_size, witness, line, time_ms) "
                                      "VALUES (?, ?, ?, ?)", (tree_size, witness, line, time_ms))
            return cursor.rowcount == 1

    def cosignatures(self, tree_size: int) -> list[str]:
        with self._lock:
            try:
                found = self._db.execute("SELECT line FROM audit_cosignatures WHERE tree_size = ? ORDER BY witness",
                                         (tree_size,)).fetchall()
            except sqlite3.OperationalError:  # read-only, from before cosignatures: none
                return []
        return [str(line) for (line,) in found]

    def row(self, seq: int) -> Row | None:
        return self._one(f"SELECT {COLUMNS} FROM audit_log WHERE seq = ?", (seq,))

    def last_checkpoint(self, before_seq: int | None = None) -> Row | None:
        """The latest checkpoint row (before row ``before_seq`` when given)."""
        return self._one(f"SELECT {COLUMNS} FROM audit_log WHERE kind = 'checkpoint' AND seq < ? "
                         "ORDER BY seq DESC LIMIT 1", (before_seq if before_seq is not None else 1 << 62,))

    def _fetch(self, query: str, params: list[object]) -> list[tuple[object, ...]]:
        """One query on this connection (the caller holds the lock)."""
        return self._db.execute(query, params).fetchall()

    def last(self) -> Row | None:
        return self._one(f"SELECT {COLUMNS} FROM audit_log ORDER BY seq DESC LIMIT 1", ())

    def get(self, audit_id: str) -> Row | None:
        return self._one(f"SELECT {COLUMNS} FROM audit_log WHERE audit_id = ? AND kind = 'request' "
                         "ORDER BY seq LIMIT 1", (audit_id,))

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM audit_log").fetchone()[0])

    def iterate(self, filters: Filters | None = None, start_seq: int = 1) -> Iterator[Row]:
        where, params = filter_sql(filters, "?")
        last_seq = start_seq - 1
        while True:  # pages, so a long export neither holds the lock nor loads the whole log
            params[0] = last_seq + 1
            with self._lock:
                page = self._db.execute(f"SELECT {COLUMNS} FROM audit_log WHERE {' AND '.join(where)} "
                                        "ORDER BY seq LIMIT 500", params).fetchall()
            if not page:
                return
            for raw in page:
                yield _row(raw)
            last_seq = page[-1][0]

    def read_page(self, first_seq: int, limit: int) -> list[RawRow]:
        with self._lock:  # seq is the rowid: one seek and a range read (stepping releases the GIL)
            return self._db.execute(f"SELECT {COLUMNS} FROM audit_log WHERE seq >= ? ORDER BY seq LIMIT ?",
                                    (first_seq, limit)).fetchall()

    def reader(self) -> Callable[[], SQLiteAuditStore]:
        """Opens a read-only connection to this file (picklable: verify's processes open their own)."""
        return functools.partial(SQLiteAuditStore, self.path, readonly=True)

    def local_file(self) -> Path:
        return self.path

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _one(self, sql: str, params: tuple[object, ...]) -> Row | None:
        with self._lock:
            raw = self._db.execute(sql, params).fetchone()
        return _row(raw) if raw else None
