"""The audit log on both stores: append-only, and every kind of tampering is found and located.

Each test builds a real log through the real sink (hash chain, Ed25519 checkpoints every 4
records, checkpoint file), then tampers with the database behind the store's back the way an
insider with database access would (triggers disabled first), and checks that ``verify_log``
fails naming the first bad sequence number. Each log is built twice: all ``proctor.audit/3`` (what
the sink writes), and as a log written by the older writers and continued since: its first records
``proctor.audit/1`` rows, then ``/2`` rows (written the way those writers did), the rest v3. PostgreSQL runs when
``make test`` started it (PROCTOR_TEST_POSTGRES_DSN); without it those cases skip with a message.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers.requirements import missing, require_module

from proctor.audit import FORMAT, FORMAT_V1, FORMAT_V2, FORMAT_V3
from proctor.audit.canonical import canonical
from proctor.audit.chain import (
    checkpoint_message,
    load_or_create_signing_key,
    public_key_text,
    row_hash,
    row_hash_v1,
    sign,
)
from proctor.audit.sink import AuditSink, AuditUnavailable
from proctor.audit.store import AuditStore, Filters, Row
from proctor.audit.stored_body import compress, is_compressed
from proctor.audit.tree import node_id
from proctor.audit.verify import verify_log

CHECKPOINT_EVERY = 4
# In the "v1+v2+v3" layout: id-0000 … id-0002 are v1 rows, id-0003 and id-0004 v2 rows (a v2 checkpoint
# after id-0003), the rest v3 rows as the writer writes them now.
OLD_FORMATS = (FORMAT_V1, FORMAT_V1, FORMAT_V1, FORMAT_V2, FORMAT_V2)


def body(number: int, caller: str = "alice") -> dict[str, Any]:
    return {"format": FORMAT, "kind": "request", "audit_id": f"id-{number:04d}", "method": "Generate",
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
        from proctor_client.tlog.note import load_public_key

        return verify_log(self.reopen(), public_key=load_public_key(str(self.key_path)),
                          checkpoint_file=self.checkpoints)


def write_old(store: AuditStore, key: Ed25519PrivateKey, checkpoints: Path, bodies: list[dict[str, Any]],
              formats: tuple[str, ...]) -> None:
    """Rows the way the ``proctor.audit/1`` and ``/2`` writers wrote them (the record's JSON itself as
    the body; v1: the hash over seq, prev_hash and body only), and a signed checkpoint every
    CHECKPOINT_EVERY records in the format of the record before it (also in the checkpoint file)."""
    def hashed(seq: int, prev: str, kind: str, audit_id: str, time_ms: int, caller: str, request_id: str,
               finish: str, data: bytes, form: str) -> Row:
        digest = (row_hash_v1(seq, prev, data) if form == FORMAT_V1
                  else row_hash(seq, prev, kind, audit_id, time_ms, caller, request_id, finish, data))
        return Row(seq, audit_id, kind, time_ms, caller, request_id, finish, data, prev, digest)

    def build(seq: int, prev: str, _tree: object) -> list[Row]:
        rows: list[Row] = []
        for number, (record, form) in enumerate(zip(bodies, formats, strict=True), 1):
            seq, data = seq + 1, canonical({**record, "format": form})
            rows.append(hashed(seq, prev, "request", record["audit_id"], record["received_ms"],
                               record["caller"]["identity"], record["request_id"], record["finish"]["reason"], data,
                               form))
            prev = rows[-1].hash
            if number % CHECKPOINT_EVERY == 0:
                seq, now = seq + 1, 1_764_000_000_000 + seq
                data = canonical({"format": form, "kind": "checkpoint", "checkpoint_seq": seq - 1,
                                  "checkpoint_hash": prev, "time_ms": now,
                                  "public_key": public_key_text(key.public_key()),
                                  "signature": sign(key, checkpoint_message(seq - 1, prev, now))})
                rows.append(hashed(seq, prev, "checkpoint", f"checkpoint-{seq}", now, "", "", "", data, form))
                prev = rows[-1].hash
        return rows

    with checkpoints.open("a", encoding="utf-8") as handle:
        for row in store.append_chained(build):
            if row.kind == "checkpoint":
                handle.write(json.dumps({"seq": row.seq, "hash": row.hash}) + "\n")


def fill(store: AuditStore, tmp_path: Path, records: int, old_formats: tuple[str, ...] = ()) -> tuple[Path, Path]:
    key_path, checkpoints = tmp_path / "audit.key", tmp_path / "audit.checkpoints"
    key = load_or_create_signing_key(key_path)
    bodies = [body(i, caller="bob" if i % 3 == 0 else "alice") for i in range(records)]
    if old_formats:
        write_old(store, key, checkpoints, bodies[:len(old_formats)], old_formats)
    sink = AuditSink(store, key, checkpoint_file=checkpoints, checkpoint_every=CHECKPOINT_EVERY,
                     checkpoint_interval_s=3600)
    futures = [sink.submit(record) for record in bodies[len(old_formats):]]
    assert [f.result(10).seq for f in futures] == sorted(f.result(10).seq for f in futures)
    sink.close()
    return key_path, checkpoints


def sqlite_log(tmp_path: Path, records: int, old_formats: tuple[str, ...] = ()) -> Log:
    from proctor.audit.sqlite_store import SQLiteAuditStore

    path = tmp_path / "audit.db"
    key_path, checkpoints = fill(SQLiteAuditStore(path), tmp_path, records, old_formats)

    def execute(statement: str, params: tuple[object, ...]) -> None:
        db = sqlite3.connect(path, isolation_level=None)
        for table in ("audit_log", "audit_tree_nodes"):
            db.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")
            db.execute(f"DROP TRIGGER IF EXISTS {table}_no_delete")
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


def postgres_log(tmp_path: Path, records: int, old_formats: tuple[str, ...] = ()) -> Log:
    psycopg = require_module("psycopg")
    from helpers.postgres import audit_schema, postgres_dsn

    from proctor.audit.postgres_store import PostgresAuditStore

    owner = postgres_dsn()
    if owner is None:
        missing("PostgreSQL is not running (make test starts it; PROCTOR_TEST_POSTGRES_DSN)")
    owner_dsn, app_dsn = audit_schema(owner)
    key_path, checkpoints = fill(PostgresAuditStore(app_dsn), tmp_path, records, old_formats)

    def execute(statement: str, params: tuple[object, ...]) -> None:
        with psycopg.connect(owner_dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE audit_log DISABLE TRIGGER USER")
            conn.execute("ALTER TABLE audit_tree_nodes DISABLE TRIGGER USER")
            conn.execute(statement.replace("?", "%s"), params)

    def as_owner(statement: str) -> None:
        with psycopg.connect(owner_dsn, autocommit=True) as conn:
            conn.execute(statement)

    return Log(PostgresAuditStore(app_dsn), key_path, checkpoints, execute, as_owner,
               lambda: PostgresAuditStore(app_dsn),
               lambda: PostgresAuditStore(app_dsn))


STORES = {"sqlite": sqlite_log, "postgres": postgres_log}
LAYOUTS = {"v3": (), "v1+v2+v3": OLD_FORMATS}


@pytest.fixture(params=[(store, layout) for store in sorted(STORES) for layout in LAYOUTS],
                ids=lambda param: "-".join(param))
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[int], Log]]:
    store, layout = request.param
    yield lambda records: STORES[store](tmp_path, records, LAYOUTS[layout][:records])


def test_an_intact_log_verifies_and_filters_work(make_log: Callable[[int], Log]) -> None:
    log = make_log(10)
    result = log.verify()
    assert result.ok, result.problem
    assert (result.records, result.checkpoints) == (10, 3)  # after 4, after 8, and the final one at close
    assert [r.audit_id for r in log.store.iterate(Filters(caller="bob"))] == ["id-0000", "id-0003", "id-0006",
                                                                             "id-0009"]
    assert log.store.get("id-0005").request_id == "req-5"  # type: ignore[union-attr]
    assert log.store.get("nope") is None
    rows = list(log.store.iterate(None))
    formats = [_format_of(row) for row in rows]
    assert len(formats) == 13 and None not in formats
    requests = [form for row, form in zip(rows, formats, strict=True) if row.kind == "request"]
    assert requests in [list(old) + [FORMAT_V3] * (10 - len(old)) for old in LAYOUTS.values()]
    assert all(json.loads(row.record_json())["format"] == form for row, form in zip(rows, formats, strict=True))


def _format_of(row: Row) -> str | None:
    """Which format's hash the row has (None: none of them)."""
    if row.hash == row_hash_v1(row.seq, row.prev_hash, row.body):
        return FORMAT_V1
    if row.hash == row_hash(row.seq, row.prev_hash, row.kind, row.audit_id, row.time_ms, row.caller,
                            row.request_id, row.finish_reason, row.body):
        return FORMAT_V3 if is_compressed(row.body) else FORMAT_V2
    return None


def test_verify_reads_the_log_in_pages(make_log: Callable[[int], Log], monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of 3 rows (read and hashed ahead on two threads): all are checked, progress counts every
    row, a problem in a later page is found, and stopping there leaves the store usable."""
    from proctor.audit import verify
    from proctor_client.tlog.note import load_public_key

    monkeypatch.setattr(verify, "PAGE_ROWS", 3)
    log = make_log(10)
    seen: list[int] = []
    store = log.reopen()
    result = verify_log(store, public_key=load_public_key(str(log.key_path)), checkpoint_file=log.checkpoints,
                        progress=seen.append)
    assert result.ok and (result.records, result.checkpoints) == (10, 3), result
    assert seen == [3, 3, 3, 3, 1]
    k = _seq_of(log, "id-0008")
    _edit_body(log, k)
    result = verify_log(store, public_key=load_public_key(str(log.key_path)), checkpoint_file=log.checkpoints)
    assert not result.ok and result.first_bad_seq == k
    assert store.count() == 13 and store.read_page(k, 2)[0][0] == k


def test_the_sink_writes_only_its_own_format(make_log: Callable[[int], Log]) -> None:
    """A record of another format or kind fails alone (its future), the rest of the batch is written."""
    log = make_log(2)
    sink = AuditSink(log.reopen_writer(), load_or_create_signing_key(log.key_path), checkpoint_file=log.checkpoints,
                     checkpoint_every=CHECKPOINT_EVERY, checkpoint_interval_s=3600)
    futures = [sink.submit({**body(50), "format": FORMAT_V1}), sink.submit({**body(51), "kind": "checkpoint"}),
               sink.submit(body(52))]
    for future in futures[:2]:
        with pytest.raises(AuditUnavailable, match=r"this writer writes proctor\.audit/3"):
            future.result(10)
    assert futures[2].result(10).seq > 0
    sink.close()
    assert [r.audit_id for r in log.reopen().iterate(Filters())] == ["id-0000", "id-0001", "id-0052"]
    assert log.verify().ok


@pytest.mark.parametrize("stored", ["json", "compressed"])
def test_a_record_of_an_unknown_format_is_refused(make_log: Callable[[int], Log], stored: str) -> None:
    log = make_log(3)
    k = _seq_of(log, "id-0001")
    data = canonical({**body(1), "format": "proctor.audit/9"})
    data = compress(data) if stored == "compressed" else data
    log.execute("UPDATE audit_log SET body = ? WHERE seq = ?", (data, k))
    result = log.verify()
    assert not result.ok and result.first_bad_seq == k
    assert "unknown record format 'proctor.audit/9'" in result.problem


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


def _edit_body(log: Log, k: int) -> None:
    """Edit the record (re-compressed, the way the writer would have stored the edited record)."""
    row = next(r for r in log.reopen().iterate(None) if r.seq == k)
    edited = row.record_json().replace(b'"req-', b'"reQ-')
    assert edited != row.record_json()
    log.execute("UPDATE audit_log SET body = ? WHERE seq = ?", (compress(edited) if is_compressed(row.body) else edited,
                                                               k))


def _flip_a_stored_byte(log: Log, k: int) -> None:
    """A byte of the stored body changed (in a v3 row: inside the zstd frame)."""
    row = next(r for r in log.reopen().iterate(None) if r.seq == k)
    middle = len(row.body) // 2
    log.execute("UPDATE audit_log SET body = ? WHERE seq = ?",
                (row.body[:middle] + bytes([row.body[middle] ^ 1]) + row.body[middle + 1:], k))


TAMPERING = {
    # name: (how, which record must be named first)
    "edit the record": (_edit_body, 0),
    "flip a stored byte": (_flip_a_stored_byte, 0),
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
}
COLUMN_EDITS = {"kind": "'checkpoint'", "audit_id": "'id-0099'", "time_ms": "time_ms + 1", "caller": "'mallory'",
                "request_id": "'req-99'", "finish_reason": "'stop'"}
TARGETS = ["id-0002", "id-0004", "id-0007"]  # in the v1+v2+v3 layout: a v1, a v2 and a v3 row


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("tampering", sorted(TAMPERING))
def test_tampering_is_found_at_the_first_bad_record(make_log: Callable[[int], Log], tampering: str,
                                                    target: str) -> None:
    log = make_log(10)
    k = _seq_of(log, target)
    how, offset = TAMPERING[tampering]
    how(log, k)
    result = log.verify()
    assert not result.ok
    assert result.first_bad_seq == k + offset, (tampering, result)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("column", sorted(COLUMN_EDITS))
def test_editing_any_filter_column_is_found(make_log: Callable[[int], Log], column: str, target: str) -> None:
    log = make_log(10)
    k = _seq_of(log, target)
    log.execute(f"UPDATE audit_log SET {column} = {COLUMN_EDITS[column]} WHERE seq = ?", (k,))
    result = log.verify()
    assert not result.ok and result.first_bad_seq == k, (column, result)


def _rewrite_and_rechain(log: Log, rows: list[Row], k: int) -> None:
    """Row ``k``'s caller edited, and every hash from there on recomputed: the chain holds again."""
    prev = next(r for r in rows if r.seq == k - 1).hash
    for row in (r for r in rows if r.seq >= k):
        caller = "mallory" if row.seq == k else row.caller
        digest = row_hash(row.seq, prev, row.kind, row.audit_id, row.time_ms, caller, row.request_id,
                          row.finish_reason, row.body)
        log.execute("UPDATE audit_log SET caller = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                    (caller, prev, digest, row.seq))
        prev = digest


def test_a_row_rewritten_with_a_consistent_hash_is_caught_at_that_row(make_log: Callable[[int], Log]) -> None:
    """An insider who edits a v3 row and recomputes the hashes from there on (the chain then holds):
    the Merkle tree's leaf for the row no longer matches it (and the next checkpoint, which they cannot
    re-sign, covers the old hash)."""
    log = make_log(10)
    rows = list(log.reopen().iterate(None))
    k = _seq_of(log, "id-0006")
    _rewrite_and_rechain(log, rows, k)
    result = log.verify()
    assert not result.ok and result.first_bad_seq == k, result
    assert "Merkle tree's leaf" in result.problem


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
    forged = json.loads(checkpoint.record_json())
    forged["signature"] = forged["signature"][:-4] + ("AAAA" if not forged["signature"].endswith("AAAA") else "BBBB")
    from proctor.audit.canonical import canonical
    from proctor.audit.chain import row_hash

    data = compress(canonical(forged))  # a consistent row: only the signature can tell
    c = checkpoint
    log.execute("UPDATE audit_log SET body = ?, hash = ? WHERE seq = ?",
                (data, row_hash(c.seq, c.prev_hash, c.kind, c.audit_id, c.time_ms, c.caller, c.request_id,
                                c.finish_reason, data), c.seq))
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
    assert result.records == 2 + 24 and result.tree_leaves > 26  # one tree grown by both, checkpoints included
    from proctor.audit.proofs import inclusion
    from proctor_client.tlog.proof import verify_proof

    store = log.reopen()
    for row in (r for r in store.iterate(None) if r.kind == "request"):
        report = verify_proof(inclusion(store, row.audit_id).render(), _vkey(log))
        assert report.ok, (row.audit_id, report.failed)


def test_verify_in_processes_gives_the_same_verdicts(make_log: Callable[[int], Log]) -> None:
    """Each process opens the store again (``reader()``: the SQLite file, the PostgreSQL DSN)."""
    from proctor_client.tlog.note import load_public_key

    log = make_log(10)

    def both() -> tuple[Any, Any]:
        return tuple(verify_log(log.reopen(), public_key=load_public_key(str(log.key_path)),  # type: ignore[return-value]
                                checkpoint_file=log.checkpoints, processes=processes) for processes in (1, 2))

    alone, split = both()
    assert alone.ok and split.ok and (split.records, split.checkpoints) == (alone.records, alone.checkpoints) == (10, 3)
    _edit_body(log, _seq_of(log, "id-0007"))
    alone, split = both()
    assert not alone.ok and (split.first_bad_seq, split.problem) == (alone.first_bad_seq, alone.problem)


# --- the Merkle tree over the log (issue 29) ------------------------------------------------------
def _vkey(log: Log) -> str:
    from proctor.audit.chain import log_signer

    return log_signer(load_or_create_signing_key(log.key_path)).verifier.vkey()


def test_every_record_has_a_proof_a_third_party_checks(make_log: Callable[[int], Log]) -> None:
    from proctor.audit.proofs import consistency, inclusion, signed_checkpoint
    from proctor.audit.tree import root
    from proctor_client.tlog.proof import parse_proof, verify_proof

    log = make_log(10)
    store = log.reopen()
    rows = list(store.iterate(None))
    assert store.tree_size() == len(rows) == 13
    notes = {size: note for size, note in ((r.seq - 1, json.loads(r.record_json()).get("note")) for r in rows
                                           if r.kind == "checkpoint") if note}
    assert sorted(notes) in ([4, 9, 12], [9, 12])  # the old-format writers signed no tree
    latest, _ = signed_checkpoint(store)
    assert latest.size == 12 and latest.root == root(12, store.tree_nodes)
    for row in (r for r in rows if r.kind == "request"):
        proof = inclusion(store, row.audit_id)
        report = verify_proof(proof.render(), _vkey(log))
        assert report.ok, report.failed
        assert report.record is not None and report.record["audit_id"] == row.audit_id
        assert parse_proof(proof.render()) == proof
    early = inclusion(store, "id-0001", 9)
    assert verify_proof(early.render(), _vkey(log)).ok and "\n9\n" in early.checkpoint
    sizes = sorted(notes)
    for old, new in itertools.pairwise(sizes):
        proof, old_root, new_root = consistency(store, old, new)
        assert (old_root, new_root) == (root(old, store.tree_nodes), root(new, store.tree_nodes)) and proof


def test_a_proof_is_refused_where_it_does_not_hold(make_log: Callable[[int], Log]) -> None:
    """Each forgery fails ``verify_proof`` naming the check that caught it."""
    import base64

    from proctor.audit.chain import log_signer
    from proctor.audit.proofs import inclusion
    from proctor_client.tlog.proof import TlogProof, verify_proof

    log = make_log(10)
    store = log.reopen()
    proof, other = inclusion(store, "id-0006"), inclusion(store, "id-0007")
    vkey = _vkey(log)
    stranger = log_signer(Ed25519PrivateKey.generate(), log_signer(load_or_create_signing_key(log.key_path)).name)

    def failed(text: str, key: str = vkey) -> str:
        report = verify_proof(text, key)
        assert not report.ok
        return report.failed.name  # type: ignore[union-attr]

    assert failed(proof.render(), stranger.verifier.vkey()) == "log signature"
    assert failed(TlogProof(proof.index, proof.path, proof.checkpoint, other.extra).render()) == "leaf"
    assert failed(TlogProof(other.index, proof.path, proof.checkpoint, other.extra).render()) == "inclusion"
    flipped = (bytes([proof.path[0][0] ^ 1]) + proof.path[0][1:], *proof.path[1:])
    assert failed(TlogProof(proof.index, flipped, proof.checkpoint, proof.extra).render()) == "inclusion"
    lines = proof.checkpoint.split("\n")
    lines[2] = base64.b64encode(bytes(32)).decode()  # another root under the log's signature
    assert failed(TlogProof(proof.index, proof.path, "\n".join(lines), proof.extra).render()) == "log signature"
    assert failed("c2sp.org/tlog-proof@v1\nindex x\n\n" + proof.checkpoint) == "format"
    assert failed(TlogProof(proof.index, proof.path, proof.checkpoint).render()) == "leaf"  # no record in it


@pytest.mark.parametrize(("statement", "seq", "problem"), [  # nodes named by (level, index): tree.node_id
    (f"UPDATE audit_tree_nodes SET hash = ? WHERE id = {node_id(0, 6)}", 7, "leaf for this row does not match"),
    (f"UPDATE audit_tree_nodes SET hash = ? WHERE id = {node_id(2, 1)}", 5, "node (level 2, index 1) is not the hash"),
    (f"DELETE FROM audit_tree_nodes WHERE id = {node_id(1, 3)}", 7, "node (level 1, index 3) is missing"),
    (f"DELETE FROM audit_tree_nodes WHERE id = {node_id(0, 3)}", 4, "leaf for this row does not match"),
    (f"DELETE FROM audit_tree_nodes WHERE id >= {node_id(0, 11)}", 12, "misses the last rows"),
])
def test_a_tampered_tree_is_found(make_log: Callable[[int], Log], statement: str, seq: int, problem: str) -> None:
    log = make_log(10)
    log.execute(statement, (bytes(32),) if "?" in statement else ())
    result = log.verify()
    assert not result.ok and result.first_bad_seq == seq and problem in result.problem, result


def test_rows_and_tree_rewritten_together_are_caught_by_the_signed_checkpoint(make_log: Callable[[int], Log]) -> None:
    """An insider rewrites a row, re-chains every later row and rebuilds the whole tree: everything in the
    store agrees again, except with the signed checkpoints, which they cannot re-sign."""
    log = make_log(10)
    rows = list(log.reopen().iterate(None))
    k = _seq_of(log, "id-0006")
    _rewrite_and_rechain(log, rows, k)
    log.execute("DELETE FROM audit_tree_nodes", ())
    from proctor.audit.setup import ensure_tree

    assert ensure_tree(log.reopen_writer()) == len(rows)
    result = log.verify()
    next_checkpoint = min(r.seq for r in rows if r.kind == "checkpoint" and r.seq > k)
    assert not result.ok and result.first_bad_seq == next_checkpoint, result
    assert "checkpoint does not cover" in result.problem


def test_a_missing_tree_is_found_and_rebuilt_at_start(make_log: Callable[[int], Log],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With the tree gone, the signed roots have nothing to match: verify says so; the server's start
    (``ensure_tree``, as for a log from before the tree) rebuilds it, in resumable chunks."""
    from proctor.audit.setup import ensure_tree
    from proctor.audit.tree import range_hash

    log = make_log(10)
    rows = list(log.reopen().iterate(None))
    log.execute("DELETE FROM audit_tree_nodes", ())
    result = log.verify()
    assert not result.ok and result.first_bad_seq == 1 and "misses" in result.problem
    monkeypatch.setattr("proctor.audit.tree_build.CHUNK_ROWS", 3)  # resumable chunks, a transaction each
    assert ensure_tree(log.reopen_writer(), processes=2) == len(rows)  # hashed in processes
    result = log.verify()
    assert result.ok, result.problem
    store = log.reopen()
    nodes = store.tree_nodes([(0, i) for i in range(len(rows))])
    assert range_hash(0, len(rows), store.tree_nodes([(3, 0), (2, 2), (0, 12)])) == _rfc_root(
        [nodes[(0, i)] for i in range(len(rows))])


def _rfc_root(leaf_hashes: list[bytes]) -> bytes:
    """RFC 9162's MTH over leaf hashes, recursively (independent of the stored nodes)."""
    import hashlib

    if len(leaf_hashes) == 1:
        return leaf_hashes[0]
    k = 1 << ((len(leaf_hashes) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + _rfc_root(leaf_hashes[:k]) + _rfc_root(leaf_hashes[k:])).digest()


def test_a_checkpoint_asked_for_is_written_at_once(tmp_path: Path) -> None:
    """``request_checkpoint``: a caller who wants a proof now need not wait for the cadence."""
    from proctor.audit.proofs import inclusion
    from proctor.audit.sqlite_store import SQLiteAuditStore
    from proctor_client.tlog.proof import verify_proof

    store = SQLiteAuditStore(tmp_path / "audit.db")
    key = load_or_create_signing_key(tmp_path / "audit.key")
    sink = AuditSink(store, key, checkpoint_file=None, checkpoint_every=1000, checkpoint_interval_s=3600)
    try:
        for number in range(3):
            sink.submit(body(number)).result(10)
        assert store.last_checkpoint() is None
        seq = sink.request_checkpoint().result(10)
        assert seq == 4 and store.last().kind == "checkpoint"  # type: ignore[union-attr]
        assert sink.request_checkpoint().result(10) == 0  # nothing new: the last row is the checkpoint
        from proctor.audit.chain import log_signer

        proof = inclusion(store, "id-0002")
        assert verify_proof(proof.render(), log_signer(key).verifier.vkey()).ok
    finally:
        sink.close()


def test_an_old_log_takes_the_new_kinds_of_records_and_still_verifies(make_log: Callable[[int], Log]) -> None:
    """A log of v1, v2 and v3 rows (and a v3 one) goes on taking records: access, hold, release and erasure rows
    (issue 44) are chained after the old ones, and the whole log verifies (chain, checkpoints, tree)."""
    from proctor.audit.holds import hold_body

    log = make_log(6)
    sink = AuditSink(log.reopen_writer(), load_or_create_signing_key(log.key_path), checkpoint_file=log.checkpoints,
                     checkpoint_every=CHECKPOINT_EVERY, checkpoint_interval_s=3600)
    hold = hold_body({"subject": "alice"}, "case 1", "counsel")
    access = {"format": FORMAT, "kind": "access", "audit_id": "access-1", "time_ms": 1_764_000_000_500,
              "caller": {"identity": "officer"}, "method": "GetRecord", "target": {"audit_id": "id-0001"},
              "returned": 1, "status": {"code": "OK", "message": ""}}
    release = {"format": FORMAT, "kind": "release", "audit_id": "release-1", "time_ms": 1_764_000_000_600,
               "caller": {"identity": "counsel"}, "hold_id": hold["audit_id"], "reason": "closed"}
    erasure = {"format": FORMAT, "kind": "erasure", "audit_id": "erasure-1", "time_ms": 1_764_000_000_700,
               "caller": {"identity": "dpo"}, "subject": "alice", "reason": "GDPR", "key_ids": [], "keys": [],
               "records": 0}
    for record in (access, hold, release, erasure, body(99)):
        sink.submit(record).result(10)
    sink.close()
    result = log.verify()
    assert result.ok, result.problem
    assert result.records == 6 + 5
    kinds = [row.kind for row in log.reopen().iterate(Filters(include_checkpoints=True))]
    assert [kind for kind in kinds if kind not in ("request", "checkpoint")] == ["access", "hold", "release",
                                                                                  "erasure"]
