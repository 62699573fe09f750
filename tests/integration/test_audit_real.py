"""The audit trail through gRPC with the real model: one record per call outcome, tokens as streamed,
exact replay, the Audit service, the CLI, and compliance mode when the store fails."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.oracles import is_valid_json
from helpers.requirements import missing, require_module

from proctor_client import ProctorClient, ProctorError
from proctor_client.v1 import audit_pb2, audit_pb2_grpc
from proctor_client.v1 import generation_pb2 as pb

pytestmark = pytest.mark.real_model
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def audit(server: object) -> audit_pb2_grpc.AuditStub:
    channel = grpc.insecure_channel(server.address)  # type: ignore[attr-defined]
    yield audit_pb2_grpc.AuditStub(channel)
    channel.close()


def records_for(audit: audit_pb2_grpc.AuditStub, request_id: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The records of a request id (waiting briefly: a cancelled call's record is written after it ends)."""
    end = time.monotonic() + timeout_s
    while True:
        found = [json.loads(r.record_json) for r in audit.ExportRecords(
            audit_pb2.ExportRecordsRequest(request_id=request_id))]
        if found or time.monotonic() > end:
            return found
        time.sleep(0.1)


def test_a_successful_stream_is_recorded_with_every_token(client: ProctorClient, audit) -> None:  # type: ignore[no-untyped-def]
    chunks = list(client.stream_generate("The capital of France is", request_id="audit-ok", max_new_tokens=12,
                                         temperature=0))
    streamed = [t for c in chunks for t in c.token_ids]
    assert chunks[-1].audit_id
    (record,) = records_for(audit, "audit-ok")
    assert record["audit_id"] == chunks[-1].audit_id
    assert record["status"]["code"] == "OK" and record["method"] == "StreamGenerate"
    assert [t["id"] for t in record["tokens"]] == streamed
    assert all(len(t["top"]) == 5 for t in record["tokens"])
    assert record["output"]["text"] == "".join(c.text for c in chunks)
    assert record["prompt"]["text"] == "The capital of France is"
    assert record["model"]["weights_sha256"] and record["request"]["sampling"]["seed"] is not None
    assert record["caller"]["identity"].startswith(("ipv4:", "ipv6:"))
    assert record["server"]["server_forbidden_phrases"]["count"] == 0 and record["server"]["version"]


def test_a_rejected_call_is_recorded_once(client: ProctorClient, audit) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProctorError):
        client.generate("Hi", request_id="audit-bad", max_new_tokens=-3)
    (record,) = records_for(audit, "audit-bad")
    assert record["status"]["code"] == "INVALID_ARGUMENT" and "max_new_tokens" in record["status"]["message"]
    assert record["tokens"] == [] and record["raw_request"]["requestId"] == "audit-bad"


def test_a_cancelled_call_is_recorded_with_what_was_generated(client: ProctorClient, audit, wait_engine_idle) -> None:  # type: ignore[no-untyped-def]
    received: list[int] = []
    stream = client.stream_generate("Once upon a time", request_id="audit-cancel", max_new_tokens=400,
                                    temperature=0, ignore_eos=True)
    for chunk in stream:
        received += chunk.token_ids
        if len(received) >= 5:
            stream.close()  # type: ignore[attr-defined]  # closing the iterator cancels the call
            break
    assert wait_engine_idle(10)
    (record,) = records_for(audit, "audit-cancel")
    assert record["status"]["code"] == "CANCELLED"
    assert 5 <= len(record["tokens"]) < 400
    assert [t["id"] for t in record["tokens"]][: len(received)] == received


def test_a_deadline_is_recorded(client: ProctorClient, audit) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProctorError) as caught:
        # Far more tokens than 1.5 s can produce, with drafts too (a repetitive story is mostly looked up).
        client.generate("Once upon a time", request_id="audit-deadline", max_new_tokens=1500, ignore_eos=True,
                        timeout_s=1.5)
    assert caught.value.code.name == "DEADLINE_EXCEEDED"
    (record,) = records_for(audit, "audit-deadline")
    assert record["status"]["code"] == "DEADLINE_EXCEEDED"


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "top_p": 0.95, "seed": 1234}],
                         ids=["greedy", "seeded"])
def test_replay_matches_exactly(client: ProctorClient, audit, sampling: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    original = client.generate(messages=[("user", "Name three colours.")], max_new_tokens=20, **sampling)
    result = audit.Replay(audit_pb2.ReplayRequest(audit_id=original.audit_id), timeout=120)
    assert result.exact_match, result.message
    assert result.steps_compared == len(original.token_ids) and result.first_divergent_step == -1
    replay = json.loads(audit.GetRecord(audit_pb2.GetRecordRequest(audit_id=result.replay_audit_id)).record_json)
    assert replay["method"] == "Replay" and replay["replay_of"] == original.audit_id


def test_unknown_and_rejected_records_are_clear_errors(client: ProctorClient, audit) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as caught:
        audit.GetRecord(audit_pb2.GetRecordRequest(audit_id="nope"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(ProctorError):
        client.generate("Hi", request_id="audit-rejected-replay", top_logprobs=99)
    (rejected,) = records_for(audit, "audit-rejected-replay")
    with pytest.raises(grpc.RpcError) as replay_error:
        audit.Replay(audit_pb2.ReplayRequest(audit_id=rejected["audit_id"]))
    assert replay_error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "rejected" in replay_error.value.details()


def test_the_cli_shows_exports_verifies_and_replays(client: ProctorClient, server, audit_db: Path,  # type: ignore[no-untyped-def]
                                                    tmp_path: Path) -> None:
    response = client.generate("Decision:", choice=["approve", "reject"], max_new_tokens=4, request_id="audit-cli")
    env = {"PYTHONPATH": f"{REPO / 'service'}:{REPO / 'clients' / 'python' / 'src'}", "PATH": "/usr/bin:/bin"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "proctor.cli", "audit", *args], env=env, text=True,
                              capture_output=True, timeout=300, cwd=REPO)

    shown = cli("show", response.audit_id, "--db", str(audit_db))
    assert shown.returncode == 0, shown.stderr
    assert response.audit_id in shown.stdout and "allowed" in shown.stdout and response.text in shown.stdout
    out = tmp_path / "export.csv"
    exported = cli("export", "--db", str(audit_db), "--format", "csv", "--out", str(out), "--request-id", "audit-cli")
    assert exported.returncode == 0, exported.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and response.audit_id in lines[1]
    verified = cli("verify", "--db", str(audit_db))
    assert verified.returncode == 0 and "intact" in verified.stdout, verified.stdout + verified.stderr
    replayed = cli("replay", response.audit_id, "--addr", server.address)
    assert replayed.returncode == 0 and "exact match" in replayed.stdout, replayed.stdout + replayed.stderr


def test_compliance_mode_withholds_output_when_the_record_cannot_be_written(tmp_path: Path) -> None:
    from proctor.app import BackgroundServer
    from proctor.config import Settings

    background = BackgroundServer(Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False,
                                                 "audit_db": str(tmp_path / "audit.db")})).start()
    try:
        with ProctorClient(background.address, timeout_s=60) as proctor:
            assert proctor.generate("Hi", max_new_tokens=2).audit_id
            sink = background.running.audit_sink  # type: ignore[union-attr]
            sink.store.close()  # the database goes away under the running server
            with pytest.raises(ProctorError) as caught:
                proctor.generate("Hi", max_new_tokens=2)
            assert caught.value.code.name == "INTERNAL" and "error id" in caught.value.message  # not the store's text
            chunks: list[pb.GenerateChunk] = []
            with pytest.raises(ProctorError):
                chunks.extend(proctor.stream_generate("Hi", max_new_tokens=2))
            assert not any(c.finish_reason for c in chunks), "a final chunk was sent without its audit record"
    finally:
        background.stop()  # (its final checkpoint fails too, and is logged)


def test_concurrent_calls_each_get_one_record(client: ProctorClient, audit) -> None:  # type: ignore[no-untyped-def]
    results: dict[str, list[int]] = {}

    def one(index: int) -> None:
        response = client.generate(f"Count to {index}:", request_id=f"audit-many-{index}", max_new_tokens=6)
        results[f"audit-many-{index}"] = list(response.token_ids)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for request_id, tokens in results.items():
        (record,) = records_for(audit, request_id)
        assert [t["id"] for t in record["tokens"]] == tokens
    assert audit.VerifyLog(audit_pb2.VerifyLogRequest()).ok


def test_a_server_audits_into_postgresql(tmp_path: Path) -> None:
    require_module("psycopg")
    from helpers.postgres import audit_schema, postgres_dsn

    from proctor.app import BackgroundServer
    from proctor.audit.postgres_store import PostgresAuditStore
    from proctor.audit.verify import verify_log
    from proctor.config import Settings

    owner = postgres_dsn()
    if owner is None:
        missing("PostgreSQL is not running (make test starts it; PROCTOR_TEST_POSTGRES_DSN)")
    _, dsn = audit_schema(owner)
    settings = Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False, "audit_dsn": dsn,
                              "audit_signing_key": str(tmp_path / "pg.key"),
                              "audit_checkpoint_file": str(tmp_path / "pg.checkpoints")})
    background = BackgroundServer(settings).start()
    try:
        with ProctorClient(background.address, timeout_s=60) as proctor:
            response = proctor.generate("Hello", max_new_tokens=3, request_id="pg-1")
            record = json.loads(proctor.audit_record(response.audit_id).record_json)
            assert [t["id"] for t in record["tokens"]] == list(response.token_ids)
            assert proctor.verify_log().ok
    finally:
        background.stop()
    result = verify_log(PostgresAuditStore(dsn), checkpoint_file=tmp_path / "pg.checkpoints")
    # the call's record, and the access records of the two reads of the log (GetRecord, VerifyLog)
    assert result.ok and result.records == 3 and result.checkpoints == 1
    kinds = [row.kind for row in PostgresAuditStore(dsn).iterate(None) if row.kind != "checkpoint"]
    assert kinds == ["request", "access", "access"]


def test_a_fallback_request_records_its_attempts_and_replays_them(client: ProctorClient, audit) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 3, "maxItems": 3, "uniqueItems": True}
    original = client.generate("Three letters as a JSON array:", json_schema=schema, max_new_tokens=16)
    record = json.loads(audit.GetRecord(audit_pb2.GetRecordRequest(audit_id=original.audit_id)).record_json)
    assert record["constraint"]["exact"] is False and record["constraint"]["relaxed"] == ["uniqueItems at #"]
    assert [a["number"] for a in record["attempts"]] == [a.attempt for a in original.attempts]
    assert record["attempts"][-1]["valid"] == record["schema_validation"]["valid"] == original.schema_validation.valid
    assert original.schema_validation.valid == is_valid_json(original.text, schema), original.text  # the tests' own
    result = audit.Replay(audit_pb2.ReplayRequest(audit_id=original.audit_id), timeout=300)
    assert result.exact_match, result.message  # the same attempts, the same returned output


def test_with_postgresql_refusing_records_calls_fail_closed_readiness_follows_and_recovery_is_automatic(
        tmp_path: Path) -> None:
    """Compliance mode with the store gone: the call that meets it fails (INTERNAL, output withheld), the
    server then reports proctor.v1.Generation NOT_SERVING (readiness) while the whole server stays SERVING
    (liveness: a restart would not help), refuses new calls at once with UNAVAILABLE, and is back — health
    and calls — by itself when the store answers again. Every response returned is in the log."""
    psycopg = require_module("psycopg")
    from helpers.postgres import audit_schema, postgres_dsn
    from helpers.reliability import health as server_health

    from proctor.app import BackgroundServer
    from proctor.audit.postgres_store import PostgresAuditStore
    from proctor.audit.verify import verify_log
    from proctor.config import Settings

    owner = postgres_dsn()
    if owner is None:
        missing("PostgreSQL is not running (make test starts it; PROCTOR_TEST_POSTGRES_DSN)")
    owner_dsn, dsn = audit_schema(owner)  # type: ignore[arg-type]

    def as_owner(statement: str) -> None:
        with psycopg.connect(owner_dsn, autocommit=True) as conn:
            conn.execute(statement)

    settings = Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False, "audit_dsn": dsn,
                              "audit_signing_key": str(tmp_path / "pg.key"),
                              "audit_checkpoint_file": str(tmp_path / "pg.checkpoints")})
    background = BackgroundServer(settings).start()

    def health(service: str) -> str:
        return server_health(background.address, service)

    def eventually(service: str, wanted: str, timeout_s: float = 10.0) -> None:
        end = time.monotonic() + timeout_s
        while health(service) != wanted:
            assert time.monotonic() < end, f"{service or 'the server'} never became {wanted}"
            time.sleep(0.1)

    returned = []
    try:
        with ProctorClient(background.address, timeout_s=60, retries=0) as proctor:
            returned.append(proctor.generate("Hello", max_new_tokens=3).audit_id)
            assert health("proctor.v1.Generation") == "SERVING"
            as_owner("ALTER TABLE audit_log RENAME TO audit_log_away")  # the store stops taking records
            with pytest.raises(ProctorError) as withheld:
                proctor.generate("Hello", max_new_tokens=3)
            assert withheld.value.code.name == "INTERNAL" and "error id" in withheld.value.message  # no SQL, no host
            eventually("proctor.v1.Generation", "NOT_SERVING")
            assert health("") == "SERVING"
            started = time.monotonic()
            with pytest.raises(ProctorError) as refused:
                proctor.generate("Hello", max_new_tokens=3)
            assert refused.value.code.name == "UNAVAILABLE" and "audit store" in refused.value.message
            assert time.monotonic() - started < 1.0  # refused before anything ran
            as_owner("ALTER TABLE audit_log_away RENAME TO audit_log")
            eventually("proctor.v1.Generation", "SERVING")
            returned.append(proctor.generate("Hello", max_new_tokens=3).audit_id)
    finally:
        background.stop()
    result = verify_log(PostgresAuditStore(dsn), checkpoint_file=tmp_path / "pg.checkpoints")
    assert result.ok, result
    store = PostgresAuditStore(dsn)
    assert all(store.get(audit_id) is not None for audit_id in returned)


def test_proofs_over_grpc_check_offline(tmp_path: Path) -> None:
    """GetCheckpoint, GetInclusionProof and GetConsistencyProof on a server that checkpoints every record:
    the proof file verifies with nothing but the log's published key; what cannot be proved is an error."""
    from proctor.app import BackgroundServer
    from proctor.audit.chain import load_or_create_signing_key, log_signer
    from proctor.config import Settings
    from proctor_client.tlog.merkle import verify_consistency
    from proctor_client.tlog.note import parse_checkpoint, parse_note
    from proctor_client.tlog.proof import verify_proof

    db = tmp_path / "audit.db"
    server = BackgroundServer(Settings.load({"port": 0, "host": "127.0.0.1", "audit_db": str(db),
                                             "audit_checkpoint_every": 1}))
    server.start(timeout_s=300)
    try:
        with ProctorClient(server.address, timeout_s=120.0) as client:
            answers = [client.generate("Decision:", choice=["approve", "reject"], max_new_tokens=4)
                       for _ in range(3)]
            vkey = log_signer(load_or_create_signing_key(Path(f"{db}.key"))).verifier.vkey()
            latest = client.checkpoint()
            assert latest.tree_size == 5 and parse_checkpoint(parse_note(latest.note).text).root == latest.root_hash
            for answer in answers:
                proof = client.inclusion_proof(answer.audit_id)
                report = verify_proof(proof.tlog_proof, vkey)
                assert report.ok, report.failed
                assert report.record is not None and report.record["output"]["text"] == answer.text
            first = client.checkpoint(1)
            consistency = client.consistency_proof(1, latest.tree_size)
            verify_consistency(1, latest.tree_size, list(consistency.hashes), first.root_hash, latest.root_hash)
            for call, code in ((lambda: client.inclusion_proof("nope"), grpc.StatusCode.NOT_FOUND),
                               (lambda: client.checkpoint(2), grpc.StatusCode.NOT_FOUND),
                               (lambda: client.consistency_proof(4, 2), grpc.StatusCode.INVALID_ARGUMENT),
                               (lambda: client.consistency_proof(1, 99), grpc.StatusCode.FAILED_PRECONDITION)):
                with pytest.raises(ProctorError) as caught:
                    call()
                assert caught.value.code == code
    finally:
        server.stop()
