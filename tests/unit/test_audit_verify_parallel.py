"""Verify in several processes (``audit/verify_parallel.py``) names what the one-process walk names.

A real log (the sink, SQLite, a checkpoint every 7 records) of 46 rows splits into two ranges,
rows 1-23 and 24 on; every tampering is placed at the boundary, where a range takes its first row
as given and the parent has to check the link, and the result must equal the threaded verifier's
to the sequence number and the message. The processes are real (spawned interpreters).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from proctor.audit import verify_parallel
from proctor.audit.chain import load_or_create_signing_key
from proctor.audit.sink import AuditSink
from proctor.audit.sqlite_store import SQLiteAuditStore
from proctor.audit.store import Filters
from proctor.audit.verify import VerifyResult, verify_log

RECORDS, EVERY = 40, 7
ROWS = RECORDS + RECORDS // EVERY + 1  # and the final checkpoint: 46, split at 23 | 24


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "audit.db"
    sink = AuditSink(SQLiteAuditStore(path), load_or_create_signing_key(tmp_path / "audit.key"),
                     checkpoint_file=tmp_path / "audit.checkpoints", checkpoint_every=EVERY, checkpoint_interval_s=3600)
    for n in range(RECORDS):
        sink.submit({"format": "proctor.audit/3", "kind": "request", "audit_id": f"id-{n}", "request_id": f"r{n}",
                     "received_ms": 1000 + n, "caller": {"identity": "alice"},
                     "finish": {"reason": "length", "detail": ""}, "x": [n, 0.5]}).result(10)
    sink.close()
    return path


def _verify(path: Path, processes: int, progress: Callable[[int], None] | None = None) -> VerifyResult:
    return verify_log(SQLiteAuditStore(path, readonly=True), checkpoint_file=path.with_suffix(".checkpoints"),
                      processes=processes, progress=progress)


def _tamper(path: Path, *statements: str) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("DROP TRIGGER audit_log_no_update")
    db.execute("DROP TRIGGER audit_log_no_delete")
    for statement in statements:
        db.execute(statement)
    db.close()


@pytest.mark.parametrize("processes", [2, 3])
def test_an_intact_log_verifies_in_processes(log: Path, processes: int) -> None:
    seen: list[int] = []
    result = _verify(log, processes, seen.append)
    alone = _verify(log, 1)
    assert result.ok and alone.ok, (result, alone)
    assert (result.records, result.checkpoints) == (alone.records, alone.checkpoints) == (RECORDS, ROWS - RECORDS)
    assert sum(seen) == ROWS


TAMPERING = {
    "the last row of the first range edited": ["UPDATE audit_log SET caller = 'mallory' WHERE seq = 23"],
    "the first row of the second range edited": ["UPDATE audit_log SET caller = 'mallory' WHERE seq = 24"],
    "the last row of the first range deleted": ["DELETE FROM audit_log WHERE seq = 23"],
    "the first row of the second range deleted": ["DELETE FROM audit_log WHERE seq = 24"],
    "the boundary rows swapped": ["UPDATE audit_log SET seq = -1 WHERE seq = 23",
                                  "UPDATE audit_log SET seq = 23 WHERE seq = 24",
                                  "UPDATE audit_log SET seq = 24 WHERE seq = -1"],
    "the second range renumbered after a deletion": ["DELETE FROM audit_log WHERE seq = 24",
                                                     "UPDATE audit_log SET seq = seq - 1 WHERE seq > 24"],
    "the second range's first link forged": ["UPDATE audit_log SET prev_hash = hash WHERE seq = 24"],
    "the tail cut off": ["DELETE FROM audit_log WHERE seq >= 30"],
    "a row far into the second range edited": ["UPDATE audit_log SET request_id = 'r99' WHERE seq = 40"],
}


@pytest.mark.parametrize("tampering", sorted(TAMPERING))
def test_tampering_at_the_boundary_is_named_as_the_one_process_walk_names_it(log: Path, tampering: str) -> None:
    _tamper(log, *TAMPERING[tampering])
    alone, split = _verify(log, 1), _verify(log, 2)
    assert not alone.ok
    assert (split.ok, split.first_bad_seq, split.problem) == (alone.ok, alone.first_bad_seq, alone.problem)


def test_a_store_the_processes_cannot_open_fails_loudly(log: Path) -> None:
    store = SQLiteAuditStore(log, readonly=True)
    missing = functools.partial(SQLiteAuditStore, log.with_name("missing.db"), readonly=True)
    store.reader = lambda: missing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match=r"verifying records \d+\.\.\w+ failed: FileNotFoundError: no audit"):
        verify_log(store, processes=2)
    assert [row.seq for row in store.iterate(Filters(include_checkpoints=True))][-1] == ROWS  # still usable


def test_large_logs_use_processes_by_default(log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below PROCESSES_MIN_ROWS the default stays in this process; from it, one process per core."""
    calls: list[int] = []
    real = verify_parallel.verify_in_processes

    def counting(*args: object, **kwargs: object) -> verify_parallel.Merged:
        calls.append(args[2])  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("proctor.audit.verify.verify_in_processes", counting)
    assert verify_log(SQLiteAuditStore(log, readonly=True)).ok and calls == []
    monkeypatch.setattr("proctor.audit.verify.PROCESSES_MIN_ROWS", ROWS)
    monkeypatch.setattr("proctor.audit.verify.process_count", lambda: 2)
    assert verify_log(SQLiteAuditStore(log, readonly=True)).ok and calls == [2]
