"""A dead audit writer in a real server (issue 26).

A clean CI run once hung with no audit-writer thread: each call waited out its 120 s deadline. Here the
writer thread of a real server (real model, SQLite store in tmp_path, compliance mode as by default) is
ended for real: its store raises a ``BaseException`` that is not an ``Exception`` — as a SystemExit or a
KeyboardInterrupt raised on that thread would — which the writer's per-batch ``except Exception`` does not
catch, so the thread ends. Then: the call whose record met the dying writer fails at once (its output
withheld) instead of waiting out its deadline, liveness and readiness turn NOT_SERVING within a few
seconds, and later calls are refused at once with UNAVAILABLE.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.reliability import health

from proctor.audit.store import AuditStore, Build, Row
from proctor.config import Settings
from proctor_client.v1 import generation_pb2 as pb
from proctor_client.v1 import generation_pb2_grpc as pb_grpc
from tests.integration.conftest import installed_model_dir

pytestmark = pytest.mark.real_model
DEADLINE_S = 30.0  # each call's deadline: a call that waited on the dead writer would take all of it
FAST_S = 5.0  # "well under the deadline": a refusal or a withheld output answers in far less
HEALTH_WITHIN_S = 5.0  # the watchdog checks every second and reports a dead writer at once
READINESS = "proctor.v1.Generation"


class WriterKilled(BaseException):
    """Not an ``Exception``: nothing in the writer's loop catches it, so the writer thread ends."""


class KillingStore:
    """The server's own store, except that a write raises ``WriterKilled`` on the writer thread (reads go through)."""

    def __init__(self, store: AuditStore) -> None:
        self._store = store
        self.killed_on: str | None = None  # the writer thread's name when the write raised

    def append_chained(self, build: Build) -> list[Row]:
        self.killed_on = threading.current_thread().name
        raise WriterKilled("the audit writer is killed by the test")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def request(request_id: str) -> pb.GenerateRequest:
    message = pb.GenerateRequest(prompt="Hello", request_id=request_id)
    message.stopping.max_new_tokens = 3
    return message


def timed_generate(stub: pb_grpc.GenerationStub, request_id: str) -> tuple[grpc.StatusCode, str, float]:
    """One Generate with a DEADLINE_S deadline and no retries: its status code, message and seconds to answer."""
    started = time.monotonic()
    try:
        stub.Generate(request(request_id), timeout=DEADLINE_S)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", time.monotonic() - started  # type: ignore[attr-defined]
    return grpc.StatusCode.OK, "", time.monotonic() - started


def wait_for_health(address: str, service: str, wanted: str, within_s: float) -> list[str]:
    """Poll the gRPC health service until ``service`` reports ``wanted`` (or ``within_s`` passes); what it saw."""
    seen: list[str] = []
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        seen.append(health(address, service))
        if seen[-1] == wanted:
            break
        time.sleep(0.1)
    return seen


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Any]:
    from proctor.app import BackgroundServer

    installed_model_dir()
    server = BackgroundServer(Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False,
                                             "audit_db": str(tmp_path / "audit.db")}))
    server.start(timeout_s=300)
    try:
        yield server
    finally:
        server.stop()


def test_a_dead_audit_writer_turns_health_not_serving_and_calls_fail_fast(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ended: list[tuple[str, BaseException | None]] = []  # threads ended by an exception (instead of a pytest warning)
    monkeypatch.setattr(threading, "excepthook", lambda args: ended.append((args.thread.name, args.exc_value)))
    sink = served.running.audit_sink
    assert served.settings.audit_compliance and sink is not None and sink.alive
    with grpc.insecure_channel(served.address) as channel:
        stub = pb_grpc.GenerationStub(channel)
        code, message, _ = timed_generate(stub, "writer-alive")
        assert code == grpc.StatusCode.OK, message  # the writer works until it is killed
        assert health(served.address) == health(served.address, READINESS) == "SERVING"

        killer = KillingStore(sink.store)
        sink.store = killer
        code, message, seconds = timed_generate(stub, "writer-killed")  # its record is the one that kills it
        assert killer.killed_on == "proctor-audit-writer"
        assert code == grpc.StatusCode.INTERNAL and "error id" in message, (code, message)  # output withheld
        assert seconds < FAST_S, f"the call whose record met the dying writer took {seconds:.1f} s"
        end = time.monotonic() + FAST_S
        while sink.alive and time.monotonic() < end:
            time.sleep(0.05)
        assert not sink.alive, "the writer thread survived a BaseException"
        assert [(name, type(exc)) for name, exc in ended] == [("proctor-audit-writer", WriterKilled)]

        for service in ("", READINESS):  # liveness (restart me) and readiness (send me nothing)
            seen = wait_for_health(served.address, service, "NOT_SERVING", HEALTH_WITHIN_S)
            assert seen[-1] == "NOT_SERVING", (service or "the server", seen)

        for attempt in range(2):  # every later call: refused at once, not after its deadline
            code, message, seconds = timed_generate(stub, f"writer-dead-{attempt}")
            assert code == grpc.StatusCode.UNAVAILABLE, (code, message)
            assert "audit writer has stopped" in message, message
            assert seconds < FAST_S, f"a call to a server without an audit writer took {seconds:.1f} s"
