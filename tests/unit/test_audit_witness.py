"""The witness against real logs served over gRPC (the real Audit servicer on loopback, real SQLite and
PostgreSQL stores written by the real sink): it cosigns a log that grows, its cosignature reaches the
checkpoints and the proofs, and it refuses a forked or shrunk log, keeping its state and raising the
alert. ``AddCosignature`` keeps only what verifies."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.audit_log import grow
from helpers.requirements import missing

from proctor.api.audit_servicer import AuditServicer
from proctor.audit.chain import load_or_create_signing_key, log_signer
from proctor.audit.sqlite_store import SQLiteAuditStore
from proctor.audit.store import AuditStore
from proctor.audit.witness import Refused, state_file, witness_round, witness_signer
from proctor.cli import main
from proctor.config import Settings
from proctor_client import ProctorClient, ProctorError
from proctor_client.tlog.note import parse_checkpoint, parse_note, parse_vkey
from proctor_client.tlog.proof import verify_proof
from proctor_client.v1 import audit_pb2_grpc


@contextmanager
def serve_audit(store: AuditStore, settings: Settings | None = None) -> Iterator[str]:
    """The real Audit servicer over ``store`` on 127.0.0.1 (its own event loop, in a thread)."""
    loop = asyncio.new_event_loop()
    ready, held = threading.Event(), {}

    async def run() -> None:
        server = grpc.aio.server()
        audit_pb2_grpc.add_AuditServicer_to_server(
            AuditServicer(settings or Settings.load({}), store, None, None), server)  # type: ignore[arg-type]
        held["port"] = server.add_insecure_port("127.0.0.1:0")
        held["stop"] = asyncio.Event()
        await server.start()
        ready.set()
        await held["stop"].wait()
        await server.stop(None)

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"127.0.0.1:{held['port']}"
    finally:
        loop.call_soon_threadsafe(held["stop"].set)
        thread.join(10)
        assert not thread.is_alive(), "the audit server did not stop"



def copy_log(source: Path, target: Path) -> None:
    """A copy of a SQLite log as it stands (the backup API: committed pages still in the WAL included)."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    db, key = tmp_path / "log.db", tmp_path / "log.key"
    grow(SQLiteAuditStore(db), key, "a", 5)
    return {"db": db, "key": key, "vkey": parse_vkey(log_signer(load_or_create_signing_key(key)).verifier.vkey()),
            "witness": witness_signer(load_or_create_signing_key(tmp_path / "witness.key")),
            "state": tmp_path / "state"}


def test_a_growing_log_is_cosigned_and_its_proofs_carry_the_cosignature(setup: dict[str, Any]) -> None:
    witness, state = setup["witness"], setup["state"]
    with serve_audit(SQLiteAuditStore(setup["db"])) as address, ProctorClient(address, timeout_s=10) as client:
        first = witness_round(client, setup["vkey"], witness, state)
        assert first.cosigned and first.size == 6  # 5 records and the checkpoint after the 4th
        assert not witness_round(client, setup["vkey"], witness, state).cosigned  # nothing new
        grow(SQLiteAuditStore(setup["db"]), setup["key"], "b", 6)
        second = witness_round(client, setup["vkey"], witness, state)
        assert second.cosigned and second.size > first.size
        note = client.checkpoint().note
        assert parse_checkpoint(state_file(state, setup["vkey"].name).read_text()).size == second.size
        assert f"\u2014 {witness.name} " in note
        proof = client.inclusion_proof("a-1").tlog_proof
        assert verify_proof(proof, setup["vkey"], [witness.verifier.vkey()]).ok
        stranger = witness_signer(load_or_create_signing_key(setup["state"] / "other.key"))
        report = verify_proof(proof, setup["vkey"], [stranger.verifier])
        assert not report.ok and report.failed.name == "witness cosignature"  # type: ignore[union-attr]
        assert verify_proof(client.inclusion_proof("a-1", first.size).tlog_proof, setup["vkey"],
                            [witness.verifier]).ok  # the first checkpoint keeps its own cosignature


def test_a_forked_log_is_refused_and_the_state_kept(setup: dict[str, Any], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Two logs grown from one copy (same key, same origin): the witness that cosigned one refuses the other."""
    fork = tmp_path / "fork.db"
    copy_log(setup["db"], fork)
    grow(SQLiteAuditStore(setup["db"]), setup["key"], "honest", 6)
    grow(SQLiteAuditStore(fork), setup["key"], "forged", 9)
    witness, state = setup["witness"], setup["state"]
    with serve_audit(SQLiteAuditStore(setup["db"])) as honest, ProctorClient(honest, timeout_s=10) as client:
        cosigned = witness_round(client, setup["vkey"], witness, state)
    with serve_audit(SQLiteAuditStore(fork)) as forked, ProctorClient(forked, timeout_s=10) as client:
        with pytest.raises(Refused) as refused:
            witness_round(client, setup["vkey"], witness, state)
        assert refused.value.reason == "fork" and "not consistent" in str(refused.value)
        assert f"\u2014 {witness.name} " not in client.checkpoint().note
        assert parse_checkpoint(state_file(state, setup["vkey"].name).read_text()).size == cosigned.size
        capsys.readouterr()
        status = main(["audit", "witness", "--log", forked, "--log-key", setup["vkey"].vkey(), "--key",
                       str(tmp_path / "witness.key"), "--state", str(state)])
        assert status == 1 and "REFUSED" in capsys.readouterr().err


def test_a_log_that_shrank_is_refused(setup: dict[str, Any], tmp_path: Path) -> None:
    early = tmp_path / "early.db"
    copy_log(setup["db"], early)
    grow(SQLiteAuditStore(setup["db"]), setup["key"], "b", 6)
    witness, state = setup["witness"], setup["state"]
    with serve_audit(SQLiteAuditStore(setup["db"])) as address, ProctorClient(address, timeout_s=10) as client:
        witness_round(client, setup["vkey"], witness, state)
    with serve_audit(SQLiteAuditStore(early)) as address, ProctorClient(address, timeout_s=10) as client, \
            pytest.raises(Refused) as refused:
        witness_round(client, setup["vkey"], witness, state)
    assert refused.value.reason == "shrank"


def test_add_cosignature_keeps_only_what_verifies(setup: dict[str, Any]) -> None:
    witness = setup["witness"]
    other = witness_signer(load_or_create_signing_key(setup["state"] / "other.key"))
    settings = Settings.load({"audit_witnesses": witness.verifier.vkey()})
    with serve_audit(SQLiteAuditStore(setup["db"]), settings) as address, \
            ProctorClient(address, timeout_s=10) as client:
        note = parse_note(client.checkpoint().note)
        size = parse_checkpoint(note.text).size
        line = witness.signature_line(note.text, 1_764_000_000)
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        cases = [((size, "not a key", line), invalid),
                 ((size, witness.verifier.vkey(), other.signature_line(note.text, 1)), invalid),
                 ((size, witness.verifier.vkey(), witness.signature_line("x\n1\nAAAA\n", 1)), invalid),
                 ((size, witness.verifier.vkey(), witness.signature_line(note.text, 4_000_000_000)), invalid),
                 ((size, other.verifier.vkey(), other.signature_line(note.text, 1)), grpc.StatusCode.PERMISSION_DENIED),
                 ((3, witness.verifier.vkey(), line), grpc.StatusCode.NOT_FOUND)]
        for args, code in cases:
            with pytest.raises(ProctorError) as caught:
                client.add_cosignature(*args)
            assert caught.value.code == code, args
        assert client.add_cosignature(size, witness.verifier.vkey(), line) is True
        assert client.add_cosignature(size, witness.verifier.vkey(), line) is False  # kept once
        assert client.checkpoint().note.count(f"\u2014 {witness.name} ") == 1


def test_the_witness_follows_replicas_sharing_one_postgresql_log(tmp_path: Path) -> None:
    """Two servers append to one PostgreSQL tree at once; the witness asks each in turn and cosigns both."""
    from helpers.postgres import audit_schema, postgres_dsn

    from proctor.audit.postgres_store import PostgresAuditStore

    owner = postgres_dsn()
    if owner is None:
        missing("PostgreSQL is not running (make test starts it; PROCTOR_TEST_POSTGRES_DSN)")
    _, dsn = audit_schema(owner)
    key = tmp_path / "log.key"
    vkey = parse_vkey(log_signer(load_or_create_signing_key(key)).verifier.vkey())
    witness, state = witness_signer(load_or_create_signing_key(tmp_path / "w.key")), tmp_path / "state"
    with serve_audit(PostgresAuditStore(dsn)) as first, serve_audit(PostgresAuditStore(dsn)) as second, \
            ProctorClient(first, timeout_s=10) as one, ProctorClient(second, timeout_s=10) as two:
        for round_ in range(3):
            writers = [threading.Thread(target=grow, args=(PostgresAuditStore(dsn), key, f"r{round_}w{w}", 5))
                       for w in range(2)]
            for thread in writers:
                thread.start()
            for thread in writers:
                thread.join(30)
            sizes = [witness_round(client, vkey, witness, state).size for client in (one, two)]
            assert sizes[0] == sizes[1] and sizes[0] >= 10 * (round_ + 1)  # each round: 10 records, checkpoints
        proof = one.inclusion_proof("r0w1-2").tlog_proof
        assert verify_proof(proof, vkey, [witness.verifier]).ok
