"""Observability without a model: the telemetry interceptor on a real grpc.aio server, the JSON log
formatter, and the tracing switches (issue 12).

The interceptor runs in front of a small generic service whose methods answer OK, abort, raise,
stream as an async generator or by ``context.write``, and get cancelled; the status code each call
is counted under, the log line and the span must be the ones the client saw.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proctor.api.telemetry import TelemetryInterceptor
from proctor.config import Settings
from proctor.observability.calls import VALIDATE, CallObservation, stage
from proctor.observability.logs import JsonFormatter, configure_logging
from proctor.observability.metrics import Metrics
from proctor.observability.tracing import Tracing, _exporters, caller_trace_id, tracing_enabled
from tests.helpers.logs import access_log_json

SERVICE = "test.v1.Probe"


def _identity(value: bytes) -> bytes:
    return value


async def ok(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    with stage(VALIDATE):
        pass
    return request


async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no")
    raise AssertionError("unreachable")


async def crash(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    raise ValueError("boom")


async def chunks(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for i in range(3):
        yield bytes([i])


async def written(request: bytes, context: grpc.aio.ServicerContext) -> None:
    for i in range(2):
        await context.write(bytes([i]))


async def slow(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await asyncio.sleep(60)
    return request


async def forever(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    yield b"x"
    await asyncio.sleep(60)
    yield b"y"


HANDLERS = {
    "Ok": grpc.unary_unary_rpc_method_handler(ok, _identity, _identity),
    "Refuse": grpc.unary_unary_rpc_method_handler(refuse, _identity, _identity),
    "Crash": grpc.unary_unary_rpc_method_handler(crash, _identity, _identity),
    "Slow": grpc.unary_unary_rpc_method_handler(slow, _identity, _identity),
    "Chunks": grpc.unary_stream_rpc_method_handler(chunks, _identity, _identity),
    "Written": grpc.unary_stream_rpc_method_handler(written, _identity, _identity),
    "Forever": grpc.unary_stream_rpc_method_handler(forever, _identity, _identity),
}


@pytest.fixture
def traced() -> Iterator[tuple[Metrics, Tracing, InMemorySpanExporter, io.StringIO]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with access_log_json() as stream:
        yield Metrics(), Tracing(provider), exporter, stream


async def _exercise(interceptor: TelemetryInterceptor, metadata: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    server = grpc.aio.server(interceptors=[interceptor])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, HANDLERS),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    seen: dict[str, Any] = {}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            def unary(name: str) -> Any:
                return channel.unary_unary(f"/{SERVICE}/{name}", _identity, _identity)

            def stream(name: str) -> Any:
                return channel.unary_stream(f"/{SERVICE}/{name}", _identity, _identity)

            seen["Ok"] = await unary("Ok")(b"hi", metadata=metadata)
            for name in ("Refuse", "Crash", "Missing"):
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await unary(name)(b"hi")
                seen[name] = failed.value.code()
            seen["Chunks"] = [m async for m in stream("Chunks")(b"")]
            seen["Written"] = [m async for m in stream("Written")(b"")]
            call = stream("Forever")(b"")
            assert await call.read() == b"x"
            call.cancel()
            with pytest.raises(grpc.aio.AioRpcError) as timed_out:
                await unary("Slow")(b"late", timeout=0.3)
            seen["Slow"] = timed_out.value.code()
            await asyncio.sleep(0.3)  # the server side of the cancelled stream closes after the client's
    finally:
        await server.stop(0)
    return seen


def test_each_call_is_counted_logged_and_traced_under_its_status(traced: Any) -> None:
    metrics, tracing, exporter, stream = traced
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    metadata = (("traceparent", f"00-{trace_id}-{parent}-01"),)
    seen = asyncio.run(_exercise(TelemetryInterceptor(metrics, tracing), metadata))
    assert seen["Ok"] == b"hi"
    assert seen["Refuse"] is grpc.StatusCode.INVALID_ARGUMENT
    assert seen["Crash"] is grpc.StatusCode.UNKNOWN
    assert seen["Missing"] is grpc.StatusCode.UNIMPLEMENTED
    assert seen["Chunks"] == [b"\0", b"\1", b"\2"] and seen["Written"] == [b"\0", b"\1"]

    def count(method: str, code: str) -> float | None:
        return metrics.registry.get_sample_value("proctor:requests_total",
                                                 {"service": SERVICE, "method": method, "code": code})

    assert count("Ok", "OK") == 1
    assert count("Refuse", "INVALID_ARGUMENT") == 1
    assert count("Crash", "UNKNOWN") == 1
    assert count("Chunks", "OK") == 1 and count("Written", "OK") == 1
    assert count("Forever", "CANCELLED") == 1
    assert metrics.registry.get_sample_value(
        "proctor:requests_total", {"service": "unknown", "method": "unknown", "code": "UNIMPLEMENTED"}) == 1
    assert seen["Slow"] is grpc.StatusCode.DEADLINE_EXCEEDED
    assert count("Slow", "DEADLINE_EXCEEDED") == 1

    lines = stream.records()
    codes = {(line["rpc"], line["code"]) for line in lines}
    assert {(f"{SERVICE}/Ok", "OK"), (f"{SERVICE}/Refuse", "INVALID_ARGUMENT"), (f"{SERVICE}/Crash", "UNKNOWN"),
            (f"{SERVICE}/Forever", "CANCELLED")} <= codes
    traced_line = next(line for line in lines if line["rpc"] == f"{SERVICE}/Ok" and line.get("trace_id"))
    assert traced_line["trace_id"] == trace_id and traced_line["duration_ms"] >= 0

    spans = exporter.get_finished_spans()
    rpc = next(s for s in spans if s.name == f"{SERVICE}/Ok" and format(s.context.trace_id, "032x") == trace_id)
    assert format(rpc.parent.span_id, "016x") == parent
    child = next(s for s in spans if s.name == VALIDATE and s.context.trace_id == rpc.context.trace_id)
    assert child.parent.span_id == rpc.context.span_id
    refused = next(s for s in spans if s.name == f"{SERVICE}/Refuse")
    assert not refused.status.is_ok and refused.attributes["rpc.grpc.status_code"] == 3


def test_without_tracing_the_callers_trace_id_is_still_logged(traced: Any) -> None:
    metrics, _, _, stream = traced
    trace_id = secrets.token_hex(16)
    metadata = (("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01"),)
    asyncio.run(_exercise(TelemetryInterceptor(None, None), metadata))
    lines = stream.records()
    assert any(line.get("trace_id") == trace_id and line["rpc"] == f"{SERVICE}/Ok" for line in lines)
    assert metrics.registry.get_sample_value("proctor:requests_total",
                                             {"service": SERVICE, "method": "Ok", "code": "OK"}) is None


def test_json_formatter_writes_one_object_per_line() -> None:
    record = logging.LogRecord("proctor.x", logging.WARNING, __file__, 1, "hello %s", ("world",), None)
    record.fields = {"request_id": "r-1", "completion_tokens": 3}
    data = json.loads(JsonFormatter().format(record))
    assert data["message"] == "hello world" and data["level"] == "WARNING" and data["logger"] == "proctor.x"
    assert data["request_id"] == "r-1" and data["completion_tokens"] == 3 and data["ts"].endswith("Z")
    try:
        raise RuntimeError("multi\nline")
    except RuntimeError:
        import sys

        failed = logging.LogRecord("proctor.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonFormatter().format(failed)
    assert "\n" not in line and "RuntimeError" in json.loads(line)["exception"]
    with pytest.raises(ValueError, match="log format"):
        configure_logging("INFO", "xml")
    with pytest.raises(ValueError, match="log_format"):
        Settings.load({"log_format": "xml"}, environ={})


def test_tracing_switches_and_exporters() -> None:
    assert not tracing_enabled(False, {})
    assert not tracing_enabled(False, {"OTEL_TRACES_EXPORTER": "none"})
    assert tracing_enabled(False, {"OTEL_TRACES_EXPORTER": "console"})
    assert tracing_enabled(True, {})
    assert [type(e).__name__ for e in _exporters({"OTEL_TRACES_EXPORTER": "console"})] == ["ConsoleSpanExporter"]
    assert [type(e).__name__ for e in _exporters({})] == ["OTLPSpanExporter"]  # OTel's default once on
    assert _exporters({"OTEL_TRACES_EXPORTER": "none"}) == []
    with pytest.raises(ValueError, match="not supported"):
        _exporters({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="proto-http"):
        _exporters({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    trace_id = secrets.token_hex(16)
    assert caller_trace_id((("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01"),)) == trace_id
    assert caller_trace_id((("traceparent", "garbage"),)) == ""
    assert caller_trace_id(()) == ""


def test_metrics_are_per_server_and_bounded() -> None:
    first, second = Metrics(), Metrics()  # two servers in one process: no duplicate-registration error
    first.decode_step(0.01, 4)
    first.masks(0.001, ["forbidden", "", "forbidden", "constraint"])
    first.compiled("llguidance", 0.02, False)
    assert first.registry.get_sample_value("proctor:decode_step_seconds_count") == 1
    assert first.registry.get_sample_value("proctor:forbidden_phrase_hits_total") == 2
    assert first.registry.get_sample_value("proctor:constraint_compile_failures_total", {"engine": "llguidance"}) == 1
    assert second.registry.get_sample_value("proctor:decode_step_seconds_count") == 0
    observation = CallObservation(SERVICE, "Ok", 0, 0.0)
    first.record_call(observation, "OK", 0.1)  # no call record: counted, nothing else
    assert first.registry.get_sample_value("proctor:e2e_request_latency_seconds_count", {"method": "Ok"}) is None
    labels = {m.name: m for m in first.registry.collect()}
    for family in labels.values():
        for sample in family.samples:
            # (outcome: drafted or accepted, engine/drafting.py)
            assert set(sample.labels) <= {"service", "method", "code", "reason", "engine", "outcome", "le"}, sample
