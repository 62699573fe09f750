"""The audit writer against a real PostgreSQL that goes away: a dropped connection is reopened (the batch is
retried only when its COMMIT was never sent), a store that refuses records is reported down and, once it
answers again, up — with nothing half-written in the chain either way.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers.postgres import audit_schema, postgres_dsn
from helpers.requirements import missing, require_module
from test_audit_store import body

from proctor.audit.chain import load_or_create_signing_key
from proctor.audit.postgres_store import PostgresAuditStore
from proctor.audit.sink import STORE_PROBE_S, AuditSink, AuditUnavailable
from proctor.audit.verify import verify_log
from proctor_client.tlog.note import load_public_key

psycopg = require_module("psycopg")


@pytest.fixture
def schema() -> tuple[str, str]:
    owner = postgres_dsn()
    if owner is None:
        missing("PostgreSQL is not running (make test starts it; PROCTOR_TEST_POSTGRES_DSN)")
    return audit_schema(owner)  # type: ignore[arg-type]


def as_owner(owner_dsn: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def verified(app_dsn: str, key: Path, checkpoints: Path) -> Any:
    return verify_log(PostgresAuditStore(app_dsn), public_key=load_public_key(str(key)), checkpoint_file=checkpoints)


def test_a_connection_the_server_dropped_is_reopened_and_the_batch_written_once(
        schema: tuple[str, str], tmp_path: Path) -> None:
    _, app_dsn = schema
    store = PostgresAuditStore(app_dsn)
    sink = AuditSink(store, load_or_create_signing_key(tmp_path / "k.pem"), checkpoint_file=tmp_path / "c")
    assert sink.submit(body(1)).result(10).seq == 1
    backend = store._conn.info.backend_pid
    # (A role may end its own backends; the owner is not a superuser.)
    (terminated,) = as_owner(app_dsn, "SELECT pg_terminate_backend(%s)", (backend,))
    assert terminated == (True,)  # as a PostgreSQL restart would: the server side of the connection is gone
    assert sink.submit(body(2)).result(10).seq == 2  # reconnected, retried, written once
    assert store._conn.info.backend_pid != backend and sink.store_healthy
    sink.close()
    result = verified(app_dsn, tmp_path / "k.pem", tmp_path / "c")
    assert result.ok and result.records == 2, result


def test_a_store_that_refuses_records_is_reported_down_then_up_without_a_write(
        schema: tuple[str, str], tmp_path: Path) -> None:
    owner_dsn, app_dsn = schema
    changes: list[tuple[bool, str]] = []
    changed = threading.Event()

    def note(healthy: bool, reason: str) -> None:
        changes.append((healthy, reason))
        changed.set()

    sink = AuditSink(PostgresAuditStore(app_dsn), load_or_create_signing_key(tmp_path / "k.pem"),
                     checkpoint_file=tmp_path / "c")
    sink.on_store_health = note
    assert sink.submit(body(1)).result(10).seq == 1
    as_owner(owner_dsn, "ALTER TABLE audit_log RENAME TO audit_log_away")  # the appender can no longer write
    with pytest.raises(AuditUnavailable, match="could not be written"):
        sink.submit(body(2)).result(10)
    assert changed.wait(5) and changes == [(False, changes[0][1])] and not sink.store_healthy
    assert "audit_log" in changes[0][1]
    changed.clear()
    time.sleep(2 * STORE_PROBE_S)
    assert not sink.store_healthy and len(changes) == 1  # its probes keep failing: still down, no flapping
    as_owner(owner_dsn, "ALTER TABLE audit_log_away RENAME TO audit_log")
    assert changed.wait(5 * STORE_PROBE_S), "the writer never noticed the store came back"
    assert changes[-1][0] is True and sink.store_healthy  # up again, with no record submitted meanwhile
    assert sink.submit(body(3)).result(10).seq == 2  # the chain goes on from the last committed record
    sink.close()
    result = verified(app_dsn, tmp_path / "k.pem", tmp_path / "c")
    assert result.ok and result.records == 2, result


def test_a_store_whose_server_is_gone_fails_its_batch_without_hanging(tmp_path: Path) -> None:
    """Without PostgreSQL at all: a store whose server is gone fails writes (no hang), and is down."""
    owner = postgres_dsn()
    if owner is None:
        missing("PostgreSQL is not running (make test starts it; PROCTOR_TEST_POSTGRES_DSN)")
    _, app_dsn = audit_schema(owner)  # type: ignore[arg-type]
    store = PostgresAuditStore(app_dsn)
    store._dsn = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2"  # where it would reconnect: nothing
    sink = AuditSink(store, Ed25519PrivateKey.generate(), checkpoint_file=None)
    as_owner(app_dsn, "SELECT pg_terminate_backend(%s)", (store._conn.info.backend_pid,))
    with pytest.raises(AuditUnavailable):
        sink.submit(body(1)).result(15)
    assert not sink.store_healthy
    sink.close(timeout_s=10)
