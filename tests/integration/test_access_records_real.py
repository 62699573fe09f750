"""Who read the log (issue 44, part 4), on SQLite and PostgreSQL: every call to the Audit service appends an
``access`` record (caller, method, what it asked for, how much it returned, its status); a caller without
``audit:read`` gets no data and its refusal is recorded; the access records are chained and verified like every
row; ``proctor audit export --kind access`` and ExportRecords(kind="access") list them."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_receipts_real import store_settings

from proctor_client import ProctorClient, ProctorError
from proctor_client.v1 import audit_pb2

pytestmark = pytest.mark.real_model
AUDITOR, WRITER = (f"token-{name}-{secrets.token_hex(8)}" for name in ("auditor", "writer"))


def callers(directory: Path) -> Path:
    path = directory / "callers.yaml"
    path.write_text(f"""callers:
  - name: compliance-officer
    token_sha256: {hashlib.sha256(AUDITOR.encode()).hexdigest()}
    roles: [generate, audit:read, audit:replay]
  - name: writer-service
    token_sha256: {hashlib.sha256(WRITER.encode()).hexdigest()}
    roles: [generate]
""")
    return path


def access_records(client: ProctorClient, wanted: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The log's access records, once there are ``wanted`` (each is queued as its call ends)."""
    end = time.monotonic() + timeout_s
    while True:
        found = [json.loads(record.record_json) for record in
                 client._audit.ExportRecords(audit_pb2.ExportRecordsRequest(kind="access"),  # type: ignore[attr-defined]
                                             metadata=[("authorization", f"Bearer {AUDITOR}")], timeout=30)]
        if len(found) >= wanted or time.monotonic() > end:
            return found
        time.sleep(0.1)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_every_audit_call_appends_an_access_record_and_a_refusal_is_one(kind: str, tmp_path: Path) -> None:
    from proctor.app import BackgroundServer
    from proctor.audit.setup import open_store
    from proctor.audit.verify import verify_log
    from proctor.cli import main
    from proctor.config import Settings

    settings = Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False, **store_settings(kind, tmp_path),
                              "callers_file": str(callers(tmp_path))}, environ={})
    server = BackgroundServer(settings).start()
    try:
        with ProctorClient(server.address, timeout_s=120, token=AUDITOR) as auditor, \
                ProctorClient(server.address, timeout_s=60, retries=0, token=WRITER) as writer:
            answer = writer.generate("Hello", max_new_tokens=2)
            assert json.loads(auditor.audit_record(answer.audit_id).record_json)["audit_id"] == answer.audit_id
            assert auditor.verify_log().ok
            with pytest.raises(ProctorError) as refused:
                writer.audit_record(answer.audit_id)
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED  # no data: an error, not the record
            with pytest.raises(ProctorError) as unproved:  # no checkpoint yet: refused, and recorded as such
                auditor.inclusion_proof(answer.audit_id)
            assert unproved.value.code == grpc.StatusCode.FAILED_PRECONDITION
            records = access_records(auditor, 4)
        listed = {(r["method"], r["caller"]["identity"], r["status"]["code"]): r for r in records}
        assert set(listed) >= {("GetRecord", "compliance-officer", "OK"), ("VerifyLog", "compliance-officer", "OK"),
                               ("GetRecord", "writer-service", "PERMISSION_DENIED"),
                               ("GetInclusionProof", "compliance-officer", "FAILED_PRECONDITION")}
        read = listed[("GetRecord", "compliance-officer", "OK")]
        assert read["target"] == {"audit_id": answer.audit_id} and read["returned"] == 1
        denied = listed[("GetRecord", "writer-service", "PERMISSION_DENIED")]
        assert denied["returned"] == 0 and "audit:read" in denied["status"]["message"]
    finally:
        server.stop()
    store = open_store(settings, readonly=True)
    result = verify_log(store, processes=1)
    assert result.ok, result  # the access rows are links of the chain and leaves of the tree like any other
    flags = ["--db", settings.audit_db] if kind == "sqlite" else ["--dsn", settings.audit_dsn]
    out = tmp_path / "access.csv"
    assert main(["audit", "export", *flags, "--kind", "access", "--format", "csv", "--out", str(out)]) == 0
    rows = out.read_text(encoding="utf-8").splitlines()
    assert rows[0].startswith("seq,audit_id,time_utc,caller,method,status,target_json,returned")
    assert any("writer-service,GetRecord,PERMISSION_DENIED" in row for row in rows[1:])
