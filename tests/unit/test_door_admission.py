"""Both doors admit before they work, count by closed labels, log one line per line, and answer internal errors
with an error id (issue 54, parts 5 and 6), without a model.

The gRPC door: the server gate on a real ``grpc.aio`` server in front of a small generic service. The HTTP door:
``HttpDoor`` with a callers file under Starlette's test client (real routing, real gate, real metrics).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2
from helpers.requirements import require_module

from proctor.api.caller_limits import request_bytes_limit
from proctor.api.callers import Caller, CallerBook, CallerLimits, CallersFileError, load_callers
from proctor.api.errors import status_for
from proctor.api.failures import error_id_of
from proctor.api.gate import ServerGate
from proctor.config import Settings
from proctor.domain import (
    DeadlineExceeded,
    EngineFault,
    Overloaded,
    PermissionDenied,
    RequestValidationError,
    ShuttingDown,
    Unauthenticated,
)
from proctor.observability.calls import CallObservation
from proctor.observability.logs import TEXT_FORMAT, TextFormatter, escape_text, log_call
from proctor.observability.metrics import Metrics

WRITER, READER, SMALL = "writer-token", "reader-token", "small-token"
SECRET = "host=db.internal user=proctor_admin INSERT INTO audit_log"  # what a store's exception says
SERVICE = "proctor.v1.Generation"


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture
def book(tmp_path: Path) -> CallerBook:
    path = tmp_path / "callers.yaml"
    path.write_text(f"""callers:
  - name: writer
    token_sha256: {_sha(WRITER)}
    roles: [generate]
  - name: reader
    token_sha256: {_sha(READER)}
    roles: [audit:read]
  - name: small
    token_sha256: {_sha(SMALL)}
    roles: [generate]
    limits: {{max_request_bytes: 64}}
""")
    return CallerBook(path)


# --- the error table ---------------------------------------------------------------------------------------------

def test_an_internal_cause_reaches_the_log_with_an_id_and_the_caller_gets_only_the_id(
        caplog: pytest.LogCaptureFixture) -> None:
    try:
        try:
            raise OSError(SECRET)
        except OSError as store:
            raise EngineFault(f"the audit record could not be written: {store}") from store
    except EngineFault as caught:
        fault = caught
    with caplog.at_level(logging.ERROR, "proctor.errors"):
        status = status_for(fault)
        again = status_for(fault)  # the audit record and the answer both ask: one id, one log line
    assert status.code == code_pb2.INTERNAL and SECRET not in status.message and again == status
    error_id = error_id_of(fault)
    assert status.message == f"internal error (error id {error_id}): see the server log"
    info = error_details_pb2.RequestInfo()
    assert status.details[0].Unpack(info) and info.request_id == error_id
    logged = [r for r in caplog.records if r.name == "proctor.errors"]
    assert len(logged) == 1 and error_id in logged[0].getMessage() and SECRET in logged[0].getMessage()
    assert logged[0].exc_info is not None  # the traceback, its cause included


def test_what_the_caller_can_act_on_keeps_its_words() -> None:
    bad = status_for(RequestValidationError.single("sampling.top_p", "must be in (0, 1], got 7"))
    assert bad.code == code_pb2.INVALID_ARGUMENT and "sampling.top_p" in bad.message and "got 7" in bad.message
    busy = status_for(Overloaded("the queue is full", 250))
    assert busy.code == code_pb2.RESOURCE_EXHAUSTED and busy.message == "the queue is full"
    draining = status_for(ShuttingDown("the server is shutting down"))
    assert draining.code == code_pb2.UNAVAILABLE and draining.message == "the server is shutting down"
    unexpected = status_for(KeyError(SECRET))
    assert unexpected.code == code_pb2.INTERNAL and SECRET not in unexpected.message
    assert "KeyError" not in unexpected.message


def test_both_doors_answer_each_domain_error_with_the_same_status() -> None:
    """The one table, in each door's form: the gRPC status (with its details) and the HTTP status, OpenAI's
    error type and code, ``param`` by body key, and the retry and error-id headers."""
    from proctor.openai_http.errors import failure_response

    cases = [(RequestValidationError.single("stopping.stop[1]", "too long"), code_pb2.INVALID_ARGUMENT, 400,
              "invalid_request_error"),
             (Overloaded("busy", 1500), code_pb2.RESOURCE_EXHAUSTED, 429, "rate_limit_error"),
             (ShuttingDown("draining"), code_pb2.UNAVAILABLE, 503, "service_unavailable_error"),
             (Unauthenticated("who"), code_pb2.UNAUTHENTICATED, 401, "authentication_error"),
             (PermissionDenied("no"), code_pb2.PERMISSION_DENIED, 403, "permission_error"),
             (DeadlineExceeded("late"), code_pb2.DEADLINE_EXCEEDED, 504, "timeout_error"),
             (KeyError(SECRET), code_pb2.INTERNAL, 500, "server_error")]
    for error, grpc_code, http_status, kind in cases:
        status = status_for(error)
        answer = failure_response(error, lambda path: path.replace("stopping.stop", "stop"))
        body = json.loads(bytes(answer.body))["error"]
        assert status.code == grpc_code and answer.status_code == http_status and body["type"] == kind, error
        assert body["code"] == code_pb2.Code.Name(grpc_code).lower() and body["message"] == status.message.replace(
            "stopping.stop", "stop")
    bad = json.loads(bytes(failure_response(cases[0][0], lambda path: path.replace("stopping.stop", "stop")).body))
    assert bad["error"]["param"] == "stop[1]" and bad["error"]["message"] == "stop[1]: too long"
    busy = failure_response(Overloaded("busy", 1500), str)
    assert busy.headers["retry-after"] == "2" and busy.headers["retry-after-ms"] == "1500"
    crash = failure_response(cases[-1][0], str)
    assert crash.headers["x-proctor-error-id"] == error_id_of(cases[-1][0]) and SECRET not in bytes(crash.body).decode()


# --- the caller's own size limit ---------------------------------------------------------------------------------

def test_a_callers_request_limit_is_its_own_under_the_servers(tmp_path: Path) -> None:
    own = Caller("c", frozenset({"generate"}), limits=CallerLimits(max_request_bytes=100))
    assert request_bytes_limit(own, 1000) == 100 and request_bytes_limit(own, 10) == 10
    assert request_bytes_limit(Caller("d", frozenset()), 1000) == 1000 and request_bytes_limit(None, 5) == 5
    assert request_bytes_limit(own, None) == 100
    path = tmp_path / "callers.yaml"
    path.write_text(f"callers:\n  - {{name: c, token_sha256: {_sha('t')}, roles: [generate], "
                    "limits: {max_request_bytes: 1.5}}\n")
    with pytest.raises(CallersFileError, match="max_request_bytes must be a whole number"):
        load_callers(path)


# --- the gRPC door -----------------------------------------------------------------------------------------------

def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def _crash(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    raise RuntimeError(SECRET)


def _strict(raw: bytes) -> bytes:
    """A request type whose bytes must start with ``ok``: anything else does not decode."""
    if not raw.startswith(b"ok"):
        raise ValueError(f"undecodable {raw[:8]!r}")
    return raw


async def _grpc_calls(book: CallerBook) -> dict[str, tuple[grpc.StatusCode, str]]:
    handlers = {"Generate": grpc.unary_unary_rpc_method_handler(_echo, _strict, None),
                "GetModelInfo": grpc.unary_unary_rpc_method_handler(_crash, _strict, None)}
    server = grpc.aio.server(interceptors=[ServerGate(book, max_request_bytes=1024)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    seen: dict[str, tuple[grpc.StatusCode, str]] = {}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            async def call(name: str, method: str, body: bytes, token: str | None) -> None:
                metadata = (("authorization", f"Bearer {token}"),) if token else ()
                try:
                    await channel.unary_unary(f"/{SERVICE}/{method}")(body, metadata=metadata, timeout=10)
                    seen[name] = (grpc.StatusCode.OK, "")
                except grpc.aio.AioRpcError as error:
                    seen[name] = (error.code(), error.details() or "")

            await call("anonymous garbage", "Generate", b"\xff garbage", None)
            await call("wrong role garbage", "Generate", b"\xff garbage", READER)
            await call("known garbage", "Generate", b"\xff garbage", WRITER)
            await call("small over its limit", "Generate", b"ok" + b"x" * 100, SMALL)
            await call("small within", "Generate", b"ok" + b"x" * 10, SMALL)
            await call("writer over the server's", "Generate", b"ok" + b"x" * 2000, WRITER)
            await call("crash", "GetModelInfo", b"ok", WRITER)
    finally:
        await server.stop(0)
    return seen


def test_the_grpc_gate_admits_before_it_decodes_and_maps_a_crash(book: CallerBook,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        seen = asyncio.run(_grpc_calls(book))
    assert seen["anonymous garbage"][0] is grpc.StatusCode.UNAUTHENTICATED, seen
    assert seen["wrong role garbage"][0] is grpc.StatusCode.PERMISSION_DENIED, seen
    assert seen["known garbage"][0] is grpc.StatusCode.INVALID_ARGUMENT, seen  # admitted: now it is decoded
    code, message = seen["small over its limit"]
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "at most 64" in message and "'small'" in message
    assert seen["small within"][0] is grpc.StatusCode.OK
    assert seen["writer over the server's"][0] is grpc.StatusCode.RESOURCE_EXHAUSTED
    code, message = seen["crash"]
    assert code is grpc.StatusCode.INTERNAL and SECRET not in message and "RuntimeError" not in message, message
    error_id = message.split("error id ")[1].split(")")[0]
    assert any(error_id in r.getMessage() and SECRET in r.getMessage() for r in caplog.records)


# --- the HTTP door -----------------------------------------------------------------------------------------------

@pytest.fixture
def door(book: CallerBook) -> Iterator[tuple[Any, Metrics]]:
    require_module("httpx")
    from grpc_health.v1._async import HealthServicer
    from starlette.testclient import TestClient

    from proctor.api.admission import Admission
    from proctor.api.generation_service import GenerationService
    from proctor.api.observer import CallObserver
    from proctor.api.readiness import serving_of
    from proctor.openai_http.routes import HttpDoor

    settings = Settings.load({"max_message_bytes": 4096})
    metrics = Metrics()
    built = HttpDoor(settings, GenerationService(settings), Admission(book), CallObserver(metrics, None),
                     serving_of(HealthServicer()))
    with TestClient(built.app(), raise_server_exceptions=False) as client:
        yield client, metrics


def _series(metrics: Metrics) -> set[tuple[str, ...]]:
    return {tuple(sorted(s.labels.items())) for family in metrics.registry.collect() for s in family.samples
            if family.name == "proctor:requests"}


def test_the_http_door_admits_from_the_headers_before_it_reads_the_body(door: tuple[Any, Metrics]) -> None:
    client, _ = door
    chat = "/v1/chat/completions"
    anonymous = client.post(chat, content=b"{not json")
    assert anonymous.status_code == 401 and anonymous.json()["error"]["type"] == "authentication_error"
    assert "JSON" not in anonymous.json()["error"]["message"]
    too_big = client.post(chat, content=b"{" + b" " * 5000 + b"}")  # over the server's limit: still 401 first
    assert too_big.status_code == 401
    wrong_role = client.post(chat, content=b"{not json", headers={"authorization": f"Bearer {READER}"})
    assert wrong_role.status_code == 403
    admitted = client.post(chat, content=b"{not json", headers={"authorization": f"Bearer {WRITER}"})
    assert admitted.status_code == 400 and admitted.json()["error"]["param"] == "body"
    small = client.post(chat, content=b'{"model": "m", "messages": []' + b" " * 100 + b"}",
                        headers={"authorization": f"Bearer {SMALL}"})
    assert small.status_code == 413 and "the limit is 64" in small.json()["error"]["message"]


def test_a_refusal_that_leaves_a_large_body_unread_closes_the_connection(door: tuple[Any, Metrics]) -> None:
    client, _ = door
    large = client.post("/v1/chat/completions", content=b"x" * 70_000)
    assert large.status_code == 401 and large.headers.get("connection") == "close"
    small = client.post("/v1/chat/completions", content=b"{}")
    assert small.status_code == 401 and small.headers.get("connection") != "close"  # uvicorn skips a small one


def test_http_metric_labels_are_route_templates_or_other(door: tuple[Any, Metrics]) -> None:
    client, metrics = door
    for path in ("/v1/models/first", "/nowhere/first", "/v1/models"):
        client.get(path)
    client.get("/v1/chat/completions")  # a method the route lacks
    before = _series(metrics)
    for i in range(30):
        assert client.get(f"/v1/models/random-{i}").status_code == 401
        assert client.get(f"/nowhere/{i}%0A{i}").status_code == 404
        assert client.post(f"/v1/chat/{i}", content=b"{}").status_code == 404
    assert _series(metrics) == before
    methods = {dict(labels)["method"] for labels in before}
    assert methods == {"/v1/models/{model}", "/v1/models", "other"}, methods


def test_a_crash_in_the_http_door_is_a_500_with_an_error_id(door: tuple[Any, Metrics],
                                                             caplog: pytest.LogCaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from proctor.openai_http.routes import HttpDoor

    async def broken(self: HttpDoor, method: str, context: object) -> None:
        raise RuntimeError(SECRET)

    monkeypatch.setattr(HttpDoor, "_admit", broken)
    client, _ = door
    with caplog.at_level(logging.ERROR, "proctor.errors"):
        answer = client.get("/v1/models", headers={"authorization": f"Bearer {WRITER}"})
    error = answer.json()["error"]
    assert answer.status_code == 500 and error["type"] == "server_error" and SECRET not in answer.text
    error_id = answer.headers["x-proctor-error-id"]
    assert error["message"] == f"internal error (error id {error_id}): see the server log"
    assert any(error_id in r.getMessage() and SECRET in r.getMessage() for r in caplog.records)


# --- one log line per line ---------------------------------------------------------------------------------------

def test_text_from_a_request_cannot_start_a_log_line() -> None:
    forged = "r-1\n2026-01-01 00:00:00,000 INFO proctor.access: call rpc=forged code=OK\x1b[2J\u2028"
    assert "\n" not in escape_text(forged) and "\x1b" not in escape_text(forged)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter(TEXT_FORMAT))
    access = logging.getLogger("proctor.access")
    level = access.level
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        observation = CallObservation("openai", "/v1/chat/completions", 0, 0.0, peer=forged)
        log_call(observation, "OK", 0.01, forged)
        logging.getLogger("proctor.auth").addHandler(handler)
        logging.getLogger("proctor.auth").warning("refused from %s", forged)
    finally:
        access.removeHandler(handler)
        logging.getLogger("proctor.auth").removeHandler(handler)
        access.setLevel(level)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines  # the call's line and the refusal's: nothing forged between them
    assert 'caller="r-1\\n2026' in lines[0] and "\\u2028" in lines[0]
