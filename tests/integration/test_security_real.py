"""Security through real gRPC with the real model: TLS and mutual TLS with certificates made here, bearer
tokens from a callers file, roles, per-caller limits, the identity in the audit record, and canary secrets
that must not appear in anything the server wrote."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import secrets
import shutil
import socket
import sqlite3
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proctor.audit.stored_body import record_json
from proctor.config import Settings
from proctor_client import ProctorClient, ProctorError
from proctor_client.auth import tls_credentials
from proctor_client.v1 import generation_pb2 as pb
from tests.helpers.certs import CertificateAuthority, Issued
from tests.integration.conftest import installed_model_dir

WRITER, READER, LIMITED, DRAFTER = (f"canary-token-{name}-{secrets.token_hex(8)}"
                                   for name in ("writer", "reader", "limited", "drafter"))
HMAC_KEY = f"canary-hmac-{secrets.token_hex(16)}"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Secured:
    server: object
    ca: CertificateAuthority
    server_cert: Issued
    audit_db: Path
    canaries: list[str]
    log: io.StringIO
    trust: Path | None = None  # the CA clients trust (changes when a test rotates the certificate)

    @property
    def address(self) -> str:
        return f"localhost:{self.server.running.port}"  # type: ignore[attr-defined]

    def client(self, token: str | None = None, ca: Path | None = None, cert: Issued | None = None) -> ProctorClient:
        creds = tls_credentials(ca or self.trust or self.ca.cert, cert.cert if cert else None,
                                cert.key if cert else None)
        return ProctorClient(self.address, timeout_s=60, retries=0, credentials=creds, token=token)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _callers_file(directory: Path, auditor_subject: str) -> Path:
    path = directory / "callers.yaml"
    path.write_text(f"""callers:
  - name: writer-service
    token_sha256: {sha(WRITER)}
    roles: [generate]
  - name: compliance-officer
    token_sha256: {sha(READER)}
    roles: [audit:read]
  - name: limited-service
    token_sha256: {sha(LIMITED)}
    roles: [generate]
    limits: {{requests_per_second: 0.1, burst: 3, concurrent_streams: 1, max_new_tokens: 8}}
  - name: capped-drafter
    token_sha256: {sha(DRAFTER)}
    roles: [generate]
    limits: {{max_new_tokens: 8}}
  - name: tls-auditor
    tls_subject: "{auditor_subject}"
    roles: [generate, audit:read]
""")
    return path


def _start(tmp: Path, *, mtls: bool, log: io.StringIO) -> Secured:
    from proctor.app import BackgroundServer

    installed_model_dir()
    ca = CertificateAuthority(tmp / "pki", "proctor-test-ca")
    server_cert = ca.issue("proctor-server", server=True, file_stem="server")
    signing = tmp / "signing.pem"
    signing.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (tmp / "hmac.key").write_text(HMAC_KEY)
    auditor_subject = "CN=tls-auditor,O=Proctor Tests"
    settings = Settings.load({
        "port": 0, "host": "localhost", "warmup": False, "audit_db": str(tmp / "audit.db"),
        "audit_signing_key": str(signing), "audit_prompt_policy": "hmac", "audit_hmac_key_file": str(tmp / "hmac.key"),
        "tls_cert_file": str(server_cert.cert), "tls_key_file": str(server_cert.key),
        "tls_client_ca_file": str(ca.cert) if mtls else "", "callers_file": str(_callers_file(tmp, auditor_subject)),
        "audit_checkpoint_every": 2, "metrics_port": _free_port(), "http_port": _free_port()}, environ={})
    server = BackgroundServer(settings)
    try:
        server.start(timeout_s=300)
    except BaseException:
        server.stop()
        raise
    key_lines = [line for text in (server_cert.key_text(), signing.read_text())
                 for line in text.splitlines() if "-----" not in line and len(line) > 20]
    return Secured(server, ca, server_cert, tmp / "audit.db", [WRITER, READER, LIMITED, HMAC_KEY, *key_lines], log)


@pytest.fixture(scope="module")
def captured_log() -> Iterator[io.StringIO]:
    """Everything the server logs during this module, at DEBUG, for the canary scan."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.DEBUG)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield stream
    root.removeHandler(handler)
    root.setLevel(old_level)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, captured_log: io.StringIO) -> Iterator[Secured]:
    secured = _start(tmp_path_factory.mktemp("tls"), mtls=False, log=captured_log)
    yield secured
    secured.server.stop()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory, captured_log: io.StringIO) -> Iterator[Secured]:
    secured = _start(tmp_path_factory.mktemp("mtls"), mtls=True, log=captured_log)
    yield secured
    secured.server.stop()  # type: ignore[attr-defined]


ERRORS: list[str] = []  # every error message a client saw, for the canary scan


def _refused(call: object, code: grpc.StatusCode) -> ProctorError:
    with pytest.raises(ProctorError) as err:
        call()  # type: ignore[operator]
    ERRORS.append(str(err.value))
    assert err.value.code is code, err.value
    return err.value


def test_tls_with_tokens_and_roles(tls_server: Secured) -> None:
    with tls_server.client() as anonymous:
        assert "no credentials" in _refused(lambda: anonymous.generate("Hi", max_new_tokens=2),
                                            grpc.StatusCode.UNAUTHENTICATED).message
    with tls_server.client("not-a-known-token") as stranger:
        unknown = _refused(lambda: stranger.model_info(), grpc.StatusCode.UNAUTHENTICATED)
        assert unknown.message == "unknown bearer token"
    with tls_server.client(WRITER) as writer:
        response = writer.generate("The capital of France is", max_new_tokens=4, request_id="sec-writer")
        assert response.usage.completion_tokens == 4
        denied = _refused(lambda: writer.audit_record(response.audit_id), grpc.StatusCode.PERMISSION_DENIED)
        assert "writer-service" in denied.message and "audit:read" in denied.message
    with tls_server.client(READER) as reader:
        record = json.loads(reader.audit_record(response.audit_id).record_json)
        _refused(lambda: reader.generate("Hi", max_new_tokens=2), grpc.StatusCode.PERMISSION_DENIED)
    assert record["caller"]["identity"] == "writer-service"
    assert record["caller"]["source"] == "authenticated (token)"


def test_the_client_asserted_name_is_recorded_as_asserted(tls_server: Secured) -> None:
    with tls_server.client(WRITER) as writer:
        stub_call = writer._stub.Generate  # the plain stub, to add our own metadata
        from proctor_client import build_request

        response = stub_call(build_request("Hi", max_new_tokens=2), timeout=60,
                             metadata=[("x-proctor-caller", "someone-else")])
    with tls_server.client(READER) as reader:
        caller = json.loads(reader.audit_record(response.audit_id).record_json)["caller"]
    assert caller["identity"] == "writer-service"
    assert caller["asserted_caller"] == "someone-else (metadata (asserted by the client))"


def test_a_plaintext_client_cannot_talk_to_a_tls_server(tls_server: Secured) -> None:
    with ProctorClient(tls_server.address, timeout_s=5, retries=0, token=WRITER) as plaintext:
        _refused(lambda: plaintext.model_info(), grpc.StatusCode.UNAVAILABLE)


def test_health_is_exempt_and_reflection_needs_a_caller(tls_server: Secured) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    channel = grpc.secure_channel(tls_server.address, tls_credentials(tls_server.trust or tls_server.ca.cert))
    try:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                           timeout=10))
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
        answers = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                 timeout=10, metadata=[("authorization", f"Bearer {WRITER}")]))
        assert any(s.name == "proctor.v1.Generation" for s in answers[0].list_services_response.service)
    finally:
        channel.close()


def test_a_callers_limits_hold(tls_server: Secured) -> None:
    with tls_server.client(LIMITED) as limited:
        capped = _refused(lambda: limited.generate("Hi", max_new_tokens=9), grpc.StatusCode.INVALID_ARGUMENT)
        assert "at most 8" in capped.message
        stream = limited.stream_generate("Tell me a long story about a ship.", max_new_tokens=8, ignore_eos=True)
        first = next(stream)  # the stream holds the caller's one concurrent slot
        busy = _refused(lambda: limited.generate("Hi", max_new_tokens=2), grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert "generations running" in busy.message and busy.retry_after_s
        # a generated token, and the stream still open: the slot was held by a running generation
        assert len(first.token_ids) == 1 and first.finish_reason == pb.FINISH_REASON_UNSPECIFIED, first
        rest = list(stream)
        assert rest[-1].usage.completion_tokens == 8  # an unset-limit stream took the caller's cap
        assert sum(len(chunk.token_ids) for chunk in [first, *rest]) == 8
        over = _refused(lambda: limited.model_info(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert "requests/s" in over.message and 0 < over.retry_after_s <= 10.0  # type: ignore[operator]


def test_a_contract_draft_is_held_to_the_callers_token_cap(tls_server: Secured) -> None:
    """A draft's attempts are requests the server builds itself; the caller's cap applies to them too."""
    with tls_server.client(DRAFTER) as drafter:
        capped = _refused(lambda: drafter.draft_contract(
            "contract/nda", parties=["Acme Corp:disclosing", "Beta LLC:receiving"], request_id="capped-draft"),
            grpc.StatusCode.INVALID_ARGUMENT)
        assert "capped-drafter" in capped.message and "at most 8" in capped.message
        assert len(drafter.generate("Hi", max_new_tokens=8).token_ids) <= 8  # its plain calls are served


def test_undecodable_request_bytes_are_invalid_argument(tls_server: Secured) -> None:
    channel = grpc.secure_channel(tls_server.address, tls_credentials(tls_server.trust or tls_server.ca.cert))
    try:
        raw = channel.unary_unary("/proctor.v1.Generation/Generate")
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff\xff\x0f", timeout=10, metadata=[("authorization", f"Bearer {WRITER}")])
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid message" in err.value.details()
    finally:
        channel.close()
    assert "Traceback" not in tls_server.log.getvalue()


def _https(secured: Secured, path: str, token: str | None, ca: Path | None = None, **body: Any) -> Any:
    """A call to the HTTP door over TLS, trusting ``ca`` (default: the CA the server's certificate is from now)."""
    port = secured.server.settings.http_port  # type: ignore[attr-defined]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(verify=ssl.create_default_context(cafile=str(ca or secured.trust or secured.ca.cert)),
                      timeout=60) as client:
        if body:
            return client.post(f"https://localhost:{port}{path}", json=body, headers=headers)
        return client.get(f"https://localhost:{port}{path}", headers=headers)


def test_the_http_door_speaks_tls_with_the_same_callers(tls_server: Secured) -> None:
    model = _https(tls_server, "/v1/models", WRITER).json()["data"][0]["id"]
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    answered = _https(tls_server, "/v1/chat/completions", WRITER, **chat)
    assert answered.status_code == 200 and answered.json()["usage"]["completion_tokens"] == 3
    assert _https(tls_server, "/v1/chat/completions", None, **chat).status_code == 401
    denied = _https(tls_server, "/v1/chat/completions", READER, **chat)
    assert denied.status_code == 403 and denied.json()["error"]["type"] == "permission_error"
    ERRORS.append(denied.text)
    port = tls_server.server.settings.http_port  # type: ignore[attr-defined]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://localhost:{port}/v1/models", headers={"Authorization": f"Bearer {WRITER}"}, timeout=5)


def test_a_rotated_certificate_is_served_without_a_restart(tls_server: Secured, tmp_path: Path) -> None:
    other = CertificateAuthority(tmp_path, "rotated-ca")
    fresh = other.issue("proctor-server", server=True, file_stem="fresh")
    shutil.copy(fresh.key, tls_server.server_cert.key)
    shutil.copy(fresh.cert, tls_server.server_cert.cert)
    deadline = time.monotonic() + 10
    while True:
        try:
            with tls_server.client(WRITER, ca=other.cert) as writer:
                assert writer.model_info().model_id
            break
        except ProctorError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    while True:  # the HTTP door reads the same files
        try:
            assert _https(tls_server, "/v1/models", WRITER, other.cert).status_code == 200
            break
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    tls_server.trust = other.cert
    with tls_server.client(WRITER, ca=tls_server.ca.cert) as old_trust:  # trusting only the old CA: refused
        _refused(lambda: old_trust.model_info(), grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(httpx.ConnectError):
        _https(tls_server, "/v1/models", WRITER, tls_server.ca.cert)
    tls_server.canaries.extend(line for line in fresh.key_text().splitlines() if "-----" not in line)


def test_mutual_tls_identifies_the_caller_by_its_certificate(mtls_server: Secured, tmp_path: Path) -> None:
    auditor = mtls_server.ca.issue("tls-auditor", server=False)
    unknown = mtls_server.ca.issue("unlisted-service", server=False)
    foreign = CertificateAuthority(tmp_path, "foreign-ca").issue("tls-auditor", server=False)
    with mtls_server.client(cert=auditor) as client:
        response = client.generate("Hello", max_new_tokens=3)
        record = json.loads(client.audit_record(response.audit_id).record_json)
    assert record["caller"]["identity"] == "tls-auditor" and record["caller"]["source"] == "authenticated (tls)"
    with mtls_server.client(cert=unknown) as client:
        assert "not a known caller" in _refused(lambda: client.model_info(), grpc.StatusCode.UNAUTHENTICATED).message
    with mtls_server.client(cert=foreign) as client:  # a certificate from another CA: no handshake
        _refused(lambda: client.model_info(), grpc.StatusCode.UNAVAILABLE)
    with mtls_server.client(WRITER) as client:  # a token alone, without a client certificate: no handshake
        _refused(lambda: client.model_info(), grpc.StatusCode.UNAVAILABLE)


def test_mutual_tls_over_http_names_the_same_caller(mtls_server: Secured) -> None:
    """The HTTP door maps a client certificate to its caller exactly as gRPC does: no token needed."""
    auditor = mtls_server.ca.issue("tls-auditor", server=False, file_stem="http-auditor")
    unknown = mtls_server.ca.issue("unlisted-service", server=False, file_stem="http-unlisted")
    port = mtls_server.server.settings.http_port  # type: ignore[attr-defined]
    context = ssl.create_default_context(cafile=str(mtls_server.ca.cert))

    def post(issued: Issued, path: str = "/v1/chat/completions") -> Any:
        tls = ssl.create_default_context(cafile=str(mtls_server.ca.cert))
        tls.load_cert_chain(str(issued.cert), str(issued.key))
        with httpx.Client(verify=tls, timeout=60) as client:
            if path != "/v1/chat/completions":
                return client.get(f"https://localhost:{port}{path}")
            return client.post(f"https://localhost:{port}{path}", json={
                "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
    model = post(auditor, "/v1/models").json()["data"][0]["id"]
    answered = post(auditor)
    assert answered.status_code == 200, answered.text
    with mtls_server.client(cert=auditor) as client:
        record = json.loads(client.audit_record(answered.json()["proctor"]["audit_id"]).record_json)
    assert record["caller"]["identity"] == "tls-auditor" and record["caller"]["source"] == "authenticated (tls)"
    refused = post(unknown)
    assert refused.status_code == 401 and "not a known caller" in refused.json()["error"]["message"]
    with pytest.raises(httpx.HTTPError), httpx.Client(verify=context, timeout=10) as bare:  # no certificate
        bare.get(f"https://localhost:{port}/v1/models")


def test_an_exposed_address_is_refused_without_tls_and_callers(tmp_path: Path) -> None:
    from proctor.api.security import ExposureRefused
    from proctor.app import start_server

    settings = Settings.load({"host": "0.0.0.0", "port": 0, "audit_db": str(tmp_path / "a.db")}, environ={})
    with pytest.raises(ExposureRefused, match="--insecure"):
        asyncio.run(start_server(settings))
    assert not (tmp_path / "a.db").exists()  # refused before anything was opened


def test_no_secret_appears_in_logs_errors_or_audit_records(tls_server: Secured, mtls_server: Secured) -> None:
    # calls and refusals of its own, so the scan also holds when this test runs alone
    with tls_server.client(f"{WRITER}-revoked") as stranger:
        _refused(lambda: stranger.generate("Hi", max_new_tokens=2), grpc.StatusCode.UNAUTHENTICATED)
    with tls_server.client(WRITER) as writer:
        writer.generate("Hi", max_new_tokens=2)
    with mtls_server.client(cert=mtls_server.ca.issue("tls-auditor", server=False, file_stem="canary")) as auditor:
        auditor.generate("Hi", max_new_tokens=2)
        with mtls_server.client(cert=mtls_server.ca.issue("unlisted", server=False, file_stem="x")) as unlisted:
            _refused(lambda: unlisted.model_info(), grpc.StatusCode.UNAUTHENTICATED)
    threading.Event().wait(0.2)  # let the audit writer finish its queue
    for secured in (tls_server, mtls_server):
        with sqlite3.connect(secured.audit_db) as db:
            records = "\n".join(record_json(body).decode() for (body,) in db.execute("SELECT body FROM audit_log"))
        assert '"caller"' in records  # the scan below read real records
        metrics_port = secured.server.settings.metrics_port  # type: ignore[attr-defined]
        with urllib.request.urlopen(f"http://localhost:{metrics_port}/metrics", timeout=10) as scrape:
            metrics = scrape.read().decode()
        assert 'code="UNAUTHENTICATED"' in metrics  # the scrape saw the refused calls
        written = {"log": secured.log.getvalue(), "errors": "\n".join(ERRORS), "records": records, "metrics": metrics,
                   "database": b"".join(p.read_bytes() for p in secured.audit_db.parent.glob("audit.db*")
                                        if p.is_file()).decode("latin-1")}
        for where, text in written.items():
            leaked = [c[:24] for c in secured.canaries if c in text]
            assert not leaked, f"secrets found in the {where}: {leaked}"
    assert len(ERRORS) >= 2
