"""The PostgreSQL audit store (psycopg 3): the same table and rules as SQLite, for scaled-out servers.

Append-only twice over: triggers refuse UPDATE, DELETE and TRUNCATE, and the server should connect
as a role that was granted only SELECT and INSERT (``init_schema`` creates the table as its owner
and grants exactly that). Commits are durable only with ``synchronous_commit`` and ``fsync`` on,
which is checked when the store opens.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from proctor.audit import tree
from proctor.audit.chain import GENESIS
from proctor.audit.store import COLUMNS, Build, Filters, RawRow, Row, filter_sql
from proctor.audit.store import row_from_columns as _row

log = logging.getLogger("proctor.audit")

_T = TypeVar("_T")
WRITER_LOCK = 0x70726F63  # pg_advisory_xact_lock key shared by every proctor writer ("proc")
SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_log (
    seq BIGINT PRIMARY KEY,
    audit_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    time_ms BIGINT NOT NULL,
    caller TEXT NOT NULL,
    request_id TEXT NOT NULL,
    finish_reason TEXT NOT NULL,
    body BYTEA NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_log_audit_id ON audit_log (audit_id);
CREATE INDEX IF NOT EXISTS audit_log_time ON audit_log (time_ms);
CREATE INDEX IF NOT EXISTS audit_log_caller ON audit_log (caller, time_ms);
CREATE INDEX IF NOT EXISTS audit_log_request ON audit_log (request_id);
CREATE OR REPLACE FUNCTION proctor_audit_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the audit log is append-only: % refused', TG_OP; END $$;
DROP TRIGGER IF EXISTS audit_log_no_change ON audit_log;
CREATE TRIGGER audit_log_no_change BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION proctor_audit_refuse();
DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log;
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION proctor_audit_refuse();
REVOKE ALL ON audit_log FROM PUBLIC;
CREATE TABLE IF NOT EXISTS audit_tree_nodes (
    id BIGINT PRIMARY KEY,
    hash BYTEA NOT NULL
);
DROP TRIGGER IF EXISTS audit_tree_nodes_no_change ON audit_tree_nodes;
CREATE TRIGGER audit_tree_nodes_no_change BEFORE UPDATE OR DELETE ON audit_tree_nodes
    FOR EACH ROW EXECUTE FUNCTION proctor_audit_refuse();
DROP TRIGGER IF EXISTS audit_tree_nodes_no_truncate ON audit_tree_nodes;
CREATE TRIGGER audit_tree_nodes_no_truncate BEFORE TRUNCATE ON audit_tree_nodes
    FOR EACH STATEMENT EXECUTE FUNCTION proctor_audit_refuse();
REVOKE ALL ON audit_tree_nodes FROM PUBLIC;
CREATE TABLE IF NOT EXISTS audit_cosignatures (
    tree_size BIGINT NOT NULL,
    witness TEXT NOT NULL,
    line TEXT NOT NULL,
    time_ms BIGINT NOT NULL,
    PRIMARY KEY (tree_size, witness)
);
DROP TRIGGER IF EXISTS audit_cosignatures_no_change ON audit_cosignatures;
CREATE TRIGGER audit_cosignatures_no_change BEFORE UPDATE OR DELETE ON audit_cosignatures
    FOR EACH ROW EXECUTE FUNCTION proctor_audit_refuse();
DROP TRIGGER IF EXISTS audit_cosignatures_no_truncate ON audit_cosignatures;
CREATE TRIGGER audit_cosignatures_no_truncate BEFORE TRUNCATE ON audit_cosignatures
    FOR EACH STATEMENT EXECUTE FUNCTION proctor_audit_refuse();
REVOKE ALL ON audit_cosignatures FROM PUBLIC;
"""
TABLES = ("audit_log", "audit_tree_nodes", "audit_cosignatures")


def init_schema(owner_dsn: str, appender_role: str | None = None) -> None:
    """Create the table, indexes and triggers as the owner; grant only SELECT and INSERT to the appender."""
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        if appender_role:
            for table in TABLES:
                conn.execute(sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(sql.Identifier(table),
                                                                                 sql.Identifier(appender_role)))


class PostgresAuditStore:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn = psycopg.connect(dsn, autocommit=False)
        info = self._conn.info
        self.description = f"postgresql://{info.user}@{info.host}:{info.port}/{info.dbname}"
        with self._conn.cursor() as cur:
            for setting in ("synchronous_commit", "fsync"):
                value = _first(cur.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone())
                if value == "off":
                    raise RuntimeError(f"{self.description}: {setting} is off; audit commits would not be durable")
            every_table = " AND ".join(f"to_regclass('{table}') IS NOT NULL" for table in TABLES)
            exists = _first(cur.execute(f"SELECT {every_table}").fetchone())
        self._conn.commit()
        if not exists:
            try:
                init_schema(dsn)
            except psycopg.Error as exc:
                raise RuntimeError(f"{self.description}: the audit tables ({', '.join(TABLES)}) are missing and "
                                   f"this role cannot create them ({exc}); create them as the owner with init_schema "
                                   "/ `proctor audit init-postgres`") from exc
        self._lock = threading.Lock()

    def append_chained(self, build: Build) -> list[Row]:
        """Chain and insert one batch, with its tree nodes, in one transaction. A connection the server
        dropped (a restart) is reopened, and the batch tried once more, only when it failed before its
        COMMIT was sent: after that its outcome is unknown, and a retry could write it twice."""
        def write(cur: psycopg.Cursor[Any]) -> list[Row]:
            head = cur.execute("SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1").fetchone()
            head_seq, head_hash = head if head else (0, GENESIS)
            compact = tree.open_range(_fetcher(cur), head_seq, "%s", COLUMNS)
            rows = build(head_seq, head_hash, compact)
            for row in rows[compact.size - head_seq:]:  # leaves the build did not append itself
                compact.append(tree.row_leaf_hash(row))
            cur.executemany(f"INSERT INTO audit_log ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                            [(r.seq, r.audit_id, r.kind, r.time_ms, r.caller, r.request_id, r.finish_reason,
                              r.body, r.prev_hash, r.hash) for r in rows])
            cur.executemany(tree.insert_sql("%s"), tree.stored(compact.nodes))
            return rows
        return self._writing(write)

    def append_leaves(self, start: int, leaves: list[bytes]) -> int:
        """Append leaf hashes for rows already in the log, only if the tree has exactly ``start`` leaves."""
        def write(cur: psycopg.Cursor[Any]) -> int:
            size = tree.leaves_for(tree.node_count(_fetcher(cur)))
            if size != start:
                return size
            compact = tree.open_range(_fetcher(cur), start, "%s", COLUMNS)
            compact.extend(leaves)
            cur.executemany(tree.insert_sql("%s"), tree.stored(compact.nodes))
            return compact.size
        return self._writing(write)

    def _writing(self, write: Callable[[psycopg.Cursor[Any]], _T]) -> _T:
        """``write`` in one transaction under the writers' advisory lock; retried once on a dropped connection
        only when it failed before its COMMIT was sent."""
        with self._lock:
            for attempt in (1, 2):
                conn, committing = self._connected(), False
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT pg_advisory_xact_lock(%s)", (WRITER_LOCK,))  # writers take turns
                        result = write(cur)
                    committing = True
                    conn.commit()
                    return result
                except psycopg.OperationalError:
                    self._rollback(conn)
                    if committing or attempt == 2 or not (conn.broken or conn.closed):
                        raise
                    log.warning("%s: the connection was lost; reconnecting to retry the batch", self.description)
                except BaseException:
                    self._rollback(conn)
                    raise
        raise AssertionError("unreachable")

    def tree_size(self) -> int | None:
        with self._reading() as conn, conn.cursor() as cur:
            return tree.leaves_for(tree.node_count(_fetcher(cur)))

    def tree_nodes(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        with self._reading() as conn, conn.cursor() as cur:
            return tree.fetch_nodes(_fetcher(cur), keys, "%s")

    def tree_leaves(self, first: int, count: int) -> list[bytes]:
        with self._reading() as conn, conn.cursor() as cur:
            return tree.fetch_leaves(_fetcher(cur), first, count, "%s")

    def tree_span(self, first_id: int, last_id: int) -> list[tuple[int, bytes]]:
        with self._reading() as conn, conn.cursor() as cur:
            return tree.fetch_span(_fetcher(cur), first_id, last_id, "%s")

    def add_cosignature(self, tree_size: int, witness: str, line: str, time_ms: int) -> bool:
        def write(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute("INSERT INTO audit_cosignatures (tree_size, witness, line, time_ms) VALUES (%s, %s, %s, %s) "
                        "ON CONFLICT DO NOTHING", (tree_size, witness, line, time_ms))
            return cur.rowcount == 1
        return self._writing(write)

    def cosignatures(self, tree_size: int) -> list[str]:
        with self._reading() as conn:
            found = conn.execute("SELECT line FROM audit_cosignatures WHERE tree_size = %s ORDER BY witness",
                                 (tree_size,)).fetchall()
        return [str(line) for (line,) in found]

    def row(self, seq: int) -> Row | None:
        return self._one(f"SELECT {COLUMNS} FROM audit_log WHERE seq = %s", (seq,))

    def last_checkpoint(self, before_seq: int | None = None) -> Row | None:
        return self._one(f"SELECT {COLUMNS} FROM audit_log WHERE kind = 'checkpoint' AND seq < %s "
                         "ORDER BY seq DESC LIMIT 1", (before_seq if before_seq is not None else 1 << 62,))

    def _connected(self) -> psycopg.Connection[Any]:
        """The connection, reopened when the server dropped it (PostgreSQL restarted): writes resume by themselves."""
        if self._conn.broken or self._conn.closed:
            self._conn = psycopg.connect(self._dsn, autocommit=False)
            log.info("%s: reconnected", self.description)
        return self._conn

    @staticmethod
    def _rollback(conn: psycopg.Connection[Any]) -> None:
        if not (conn.broken or conn.closed):
            conn.rollback()

    def last(self) -> Row | None:
        return self._one(f"SELECT {COLUMNS} FROM audit_log ORDER BY seq DESC LIMIT 1", ())

    def get(self, audit_id: str) -> Row | None:
        return self._one(f"SELECT {COLUMNS} FROM audit_log WHERE audit_id = %s AND kind = 'request' "
                         "ORDER BY seq LIMIT 1", (audit_id,))

    def reader(self) -> Callable[[], PostgresAuditStore]:
        """Opens another connection with the same DSN (picklable: verify's processes open their own)."""
        return functools.partial(PostgresAuditStore, self._dsn)

    def count(self) -> int:
        with self._reading() as conn:
            value = _first(conn.execute("SELECT count(*) FROM audit_log").fetchone())
        return int(value)

    def iterate(self, filters: Filters | None = None, start_seq: int = 1) -> Iterator[Row]:
        where, params = filter_sql(filters, "%s")
        last_seq = start_seq - 1
        while True:
            params[0] = last_seq + 1
            with self._reading() as conn:
                page = conn.execute(f"SELECT {COLUMNS} FROM audit_log WHERE {' AND '.join(where)} "
                                    "ORDER BY seq LIMIT 500", params).fetchall()
            if not page:
                return
            for raw in page:
                yield _row(raw)
            last_seq = page[-1][0]

    def read_page(self, first_seq: int, limit: int) -> list[RawRow]:
        with self._reading() as conn:  # binary results: bodies arrive as bytes, not hex text to decode (5x faster)
            page = conn.execute(f"SELECT {COLUMNS} FROM audit_log WHERE seq >= %s ORDER BY seq LIMIT %s",
                                (first_seq, limit), binary=True).fetchall()
        return page

    def local_file(self) -> None:
        return None  # the server reads its own files

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _one(self, query: str, params: tuple[object, ...]) -> Row | None:
        with self._reading() as conn:
            raw = conn.execute(query, params).fetchone()
        return _row(raw) if raw else None

    @contextlib.contextmanager
    def _reading(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection for one read, under the lock; committed after, rolled back on an error (else a
        failed read would leave every later statement "in a failed transaction")."""
        with self._lock:
            conn = self._connected()
            try:
                yield conn
            except BaseException:
                self._rollback(conn)
                raise
            conn.commit()


def _fetcher(cur: psycopg.Cursor[Any]) -> tree.Fetch:
    """A query on ``cur`` with binary results (bodies and hashes as bytes)."""
    return lambda query, params: cur.execute(query, params, binary=True).fetchall()


def _first(row: tuple[Any, ...] | None) -> Any:
    """The first column of a one-row answer (these queries always return a row)."""
    if row is None:
        raise RuntimeError("the database returned no row to a query that always has one")
    return row[0]
