"""Observability on a real server (real default model, real gRPC, real HTTP scrape): issue 12.

One server for the module with metrics on (a free port), tracing on with no exporter
(``OTEL_TRACES_EXPORTER=none``) and an in-memory span exporter added to its own tracer provider.
Known traffic must move the scraped counters by exactly what the responses reported; a caller's
``traceparent`` must put the call's spans (RPC → validate, prepare → constraint.compile, queue,
prefill, decode, audit.commit) into the caller's trace, and the trace id into the audit record;
the per-call JSON log line must parse and carry the ids.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from proctor.config import Settings
from proctor_client import ProctorClient, ProctorError, build_request
from proctor_client.v1 import generation_pb2 as pb
from proctor_client.v1 import generation_pb2_grpc
from tests.helpers.logs import access_log_json

pytestmark = pytest.mark.real_model

PROMPT = "The capital of France is"
GENERATION = "proctor.v1.Generation"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def observed(model_dir: Path) -> Iterator[tuple[Any, InMemorySpanExporter]]:
    from proctor.app import BackgroundServer

    previous = os.environ.get("OTEL_TRACES_EXPORTER")
    os.environ["OTEL_TRACES_EXPORTER"] = "none"  # spans go to the in-memory exporter only
    settings = Settings.load({"port": 0, "host": "127.0.0.1", "metrics_port": _free_port(), "tracing": True,
                              "warmup": False})
    background = BackgroundServer(settings)
    try:
        background.start(timeout_s=300)
        exporter = InMemorySpanExporter()
        background.running.observability.tracing.provider.add_span_processor(SimpleSpanProcessor(exporter))
        yield background, exporter
    finally:
        background.stop()
        if previous is None:
            os.environ.pop("OTEL_TRACES_EXPORTER", None)
        else:
            os.environ["OTEL_TRACES_EXPORTER"] = previous


@pytest.fixture(scope="module")
def client(observed: tuple[Any, InMemorySpanExporter]) -> Iterator[ProctorClient]:
    with ProctorClient(observed[0].address, timeout_s=120.0, retries=0) as proctor:
        yield proctor


def scrape(server: Any) -> Samples:
    """Every sample of the server's metrics endpoint, fetched over HTTP."""
    port = server.running.observability.metrics.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape_after(server: Any, before: Samples, method: str, code: str, timeout_s: float = 10.0) -> Samples:
    """A scrape once the call ``method`` ending with ``code`` is counted: an aborted call's status reaches
    the client before the server's interceptor has recorded the call (microseconds, but a race)."""
    end = time.monotonic() + timeout_s
    while True:
        after = scrape(server)
        if requests(before, after, method, code) or time.monotonic() > end:
            return after
        time.sleep(0.02)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def requests(before: Samples, after: Samples, method: str, code: str) -> float:
    return delta(before, after, "proctor:requests_total", service=GENERATION, method=method, code=code)


def test_known_traffic_moves_the_counters_by_what_the_responses_reported(observed: Any,
                                                                         client: ProctorClient) -> None:
    server, _ = observed
    before = scrape(server)
    responses = [client.generate(PROMPT, max_new_tokens=n, temperature=0, ignore_eos=True) for n in (3, 5, 7)]
    chunks = list(client.stream_generate(PROMPT, max_new_tokens=4, temperature=0, ignore_eos=True))
    with pytest.raises(ProctorError) as rejected:
        client.generate(PROMPT, max_new_tokens=4, temperature=-1.0)
    assert rejected.value.code is grpc.StatusCode.INVALID_ARGUMENT
    after = scrape_after(server, before, "Generate", "INVALID_ARGUMENT")

    assert requests(before, after, "Generate", "OK") == 3
    assert requests(before, after, "StreamGenerate", "OK") == 1
    assert requests(before, after, "Generate", "INVALID_ARGUMENT") == 1
    usages = [r.usage for r in responses] + [chunks[-1].usage]
    assert [u.completion_tokens for u in usages] == [3, 5, 7, 4]
    assert delta(before, after, "proctor:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta(before, after, "proctor:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta(before, after, "proctor:request_finished_total", reason="length") == 4
    for name in ("proctor:time_to_first_token_seconds_count", "proctor:time_per_output_token_seconds_count",
                 "proctor:request_queue_time_seconds_count"):
        assert delta(before, after, name) == 4, name
    assert delta(before, after, "proctor:e2e_request_latency_seconds_count", method="Generate") == 3
    assert delta(before, after, "proctor:e2e_request_latency_seconds_count", method="StreamGenerate") == 1
    # 3+5+7+4 tokens: each request's first token comes with its prefill, the others from decode steps.
    assert delta(before, after, "proctor:prefill_seconds_count") >= 1
    assert 1 <= delta(before, after, "proctor:decode_step_seconds_count") <= 2 + 4 + 6 + 3
    # Compliance mode: every call (the rejected one too) is committed before its response.
    assert delta(before, after, "proctor:audit_records_written_total") == 5
    assert delta(before, after, "proctor:audit_write_seconds_count") >= 1
    assert after[("proctor:num_requests_running", ())] == 0
    assert after[("proctor:num_requests_waiting", ())] == 0
    assert after[("proctor:audit_queue_depth", ())] == 0
    assert after[("proctor:kv_cache_total_bytes", ())] == server.settings.kv_cache_mb * 1024 * 1024
    assert after[("proctor:kv_cache_used_bytes", ())] == 0  # nothing running


def test_prefix_cache_and_draft_metrics_move_by_what_the_responses_reported(observed: Any,
                                                                              client: ProctorClient) -> None:
    server, _ = observed
    system = f"Metrics {secrets.token_hex(4)}. " + "Rule: answers name their clause and invent nothing. " * 40
    before = scrape(server)
    responses = [client.generate(messages=[("system", system), ("user", question)], max_new_tokens=12,
                                 temperature=0, speculation="on")
                 for question in ("Which rule is about clauses?", "Which rule is about facts?")]
    after = scrape_after(server, before, "Generate", "OK")
    usages = [r.usage for r in responses]
    assert usages[0].cached_prompt_tokens == 0 < usages[1].cached_prompt_tokens
    assert delta(before, after, "proctor:prefix_cache_hit_tokens_total") == usages[1].cached_prompt_tokens
    assert delta(before, after, "proctor:prefix_cache_miss_tokens_total") >= usages[1].cached_prompt_tokens
    assert after[("proctor:prefix_cache_bytes", ())] > 0
    drafted = delta(before, after, "proctor:draft_tokens_total", outcome="drafted")
    assert drafted == sum(u.drafted_tokens for u in usages) > 0
    assert delta(before, after, "proctor:draft_tokens_total", outcome="accepted") == sum(u.accepted_tokens
                                                                                         for u in usages)


def test_constraint_cache_and_forbidden_phrase_metrics(observed: Any, client: ProctorClient) -> None:
    server, _ = observed
    schema = {"type": "object", "properties": {f"k{secrets.token_hex(4)}": {"type": "integer"}},
              "required": [], "additionalProperties": False}  # a schema no earlier test compiled
    before = scrape(server)
    first = client.generate(PROMPT, json_schema=schema, max_new_tokens=12, temperature=0)
    again = client.generate(PROMPT, json_schema=schema, max_new_tokens=12, temperature=0)
    middle = scrape(server)
    engine = first.constraint.backend
    assert engine and again.constraint.cache_hit and not first.constraint.cache_hit
    assert delta(before, middle, "proctor:constraint_cache_misses_total", engine=engine) >= 1
    assert delta(before, middle, "proctor:constraint_cache_hits_total", engine=engine) >= 1
    assert delta(before, middle, "proctor:constraint_compile_seconds_count", engine=engine) >= 1
    assert delta(before, middle, "proctor:mask_seconds_count") >= 1  # constrained steps build masks

    free = client.generate(PROMPT, max_new_tokens=3, temperature=0, token_details=True)
    banned = free.text.split()[0].strip(".,")  # the word the model says first: the mask must remove it
    forbidden = client.generate(PROMPT, max_new_tokens=3, temperature=0, token_details=True, forbidden=[banned])
    after = scrape(server)
    removed = sum(1 for token in forbidden.tokens if token.removed_by == "forbidden")
    assert removed >= 1
    assert delta(middle, after, "proctor:forbidden_phrase_hits_total") == removed


def test_closing_within_the_budget_moves_its_metrics_by_what_the_response_reported(observed: Any,
                                                                                    client: ProctorClient) -> None:
    server, _ = observed
    schema = {"type": "object", "properties": {"story": {"type": "string"}, "tags": {"type": "array", "minItems": 2,
                                                                                      "items": {"type": "string"}}},
              "required": ["story", "tags"], "additionalProperties": False}
    before = scrape(server)
    closed = client.generate("Tell a very long story about a lighthouse, as JSON:", json_schema=schema,
                             max_new_tokens=30, temperature=0)
    after = scrape_after(server, before, "Generate", "OK")
    assert closed.finish_reason == pb.FINISH_REASON_CLOSED_AT_BUDGET and closed.schema_validation.valid
    assert delta(before, after, "proctor:closing_tokens_total") == closed.usage.closing_tokens > 0
    assert delta(before, after, "proctor:request_finished_total", reason="closed_at_budget") == 1


def spans_of(exporter: InMemorySpanExporter, trace_id: str, root: str, timeout_s: float = 10.0) -> list[Any]:
    """The finished spans of ``trace_id`` once its ``root`` span ended (an aborted call's status reaches
    the client before the server's interceptor has closed the call)."""
    end = time.monotonic() + timeout_s
    while True:
        spans = [s for s in exporter.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id]
        if any(s.name == root for s in spans) or time.monotonic() > end:
            return spans
        time.sleep(0.02)


def test_the_span_tree_continues_the_callers_trace(observed: Any) -> None:
    server, exporter = observed
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    metadata = (("traceparent", f"00-{trace_id}-{parent_id}-01"),)
    message = build_request(PROMPT, max_new_tokens=5, temperature=0, ignore_eos=True,
                            json_schema={"type": "object", "properties": {"city": {"type": "string"}}})
    with grpc.insecure_channel(server.address) as channel:
        response = generation_pb2_grpc.GenerationStub(channel).Generate(message, metadata=metadata, timeout=120)

    spans = spans_of(exporter, trace_id, f"{GENERATION}/Generate")
    by_name = {s.name: s for s in spans}
    rpc = by_name[f"{GENERATION}/Generate"]
    assert format(rpc.parent.span_id, "016x") == parent_id and rpc.parent.is_remote
    assert rpc.attributes["proctor.audit_id"] == response.audit_id
    assert rpc.attributes["rpc.grpc.status_code"] == 0
    for name in ("validate", "prepare", "queue", "prefill", "decode", "audit.commit"):
        assert by_name[name].parent.span_id == rpc.context.span_id, name
        assert rpc.start_time <= by_name[name].start_time <= by_name[name].end_time <= rpc.end_time, name
    compile_span = by_name["constraint.compile"]
    assert compile_span.parent.span_id == by_name["prepare"].context.span_id
    assert compile_span.attributes["proctor.constraint.engine"] == response.constraint.backend
    assert compile_span.attributes["proctor.constraint.cache_hit"] is response.constraint.cache_hit
    assert by_name["decode"].attributes["gen_ai.usage.output_tokens"] == response.usage.completion_tokens
    assert by_name["prefill"].attributes["gen_ai.usage.input_tokens"] == response.usage.prompt_tokens
    assert by_name["prefill"].end_time <= by_name["decode"].start_time <= by_name["audit.commit"].start_time
    assert len([s for s in spans if s.name == "decode"]) == 1  # one span for the decode, not one per token

    record = json.loads(server.running.audit_sink.store.get(response.audit_id).record_json())
    assert record["trace_id"] == trace_id


def test_a_rejected_call_has_an_error_span(observed: Any) -> None:
    server, exporter = observed
    trace_id = secrets.token_hex(16)
    metadata = (("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01"),)
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as failed:
        generation_pb2_grpc.GenerationStub(channel).Generate(
            build_request(PROMPT, temperature=-1.0), metadata=metadata, timeout=60)
    assert failed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    spans = {s.name: s for s in spans_of(exporter, trace_id, f"{GENERATION}/Generate")}
    rpc = spans[f"{GENERATION}/Generate"]
    assert not rpc.status.is_ok and rpc.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert spans["validate"].status.status_code.name == "ERROR"
    assert "prepare" not in spans and "decode" not in spans


def test_json_log_lines_carry_the_ids(observed: Any, client: ProctorClient) -> None:
    server, _ = observed
    trace_id = secrets.token_hex(16)
    with access_log_json() as stream:
        response = client.generate(PROMPT, max_new_tokens=4, temperature=0, ignore_eos=True, request_id="log-ok-1")
        with pytest.raises(ProctorError):
            client.generate(PROMPT, max_new_tokens=4, temperature=-1.0, request_id="log-bad-1")
        with grpc.insecure_channel(server.address) as channel:
            traced = generation_pb2_grpc.GenerationStub(channel).Generate(
                build_request(PROMPT, max_new_tokens=2, temperature=0, request_id="log-traced-1"),
                metadata=(("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01"),), timeout=120)
    lines = stream.records()
    by_request = {line.get("request_id"): line for line in lines}
    ok = by_request["log-ok-1"]
    assert ok["rpc"] == f"{GENERATION}/Generate" and ok["code"] == "OK" and ok["level"] == "INFO"
    assert ok["audit_id"] == response.audit_id
    assert ok["prompt_tokens"] == response.usage.prompt_tokens
    assert ok["completion_tokens"] == response.usage.completion_tokens == 4
    assert ok["finish_reason"] == "length"
    assert 0 < ok["ttft_ms"] <= ok["duration_ms"]
    assert ok["caller"]
    bad = by_request["log-bad-1"]
    assert bad["code"] == "INVALID_ARGUMENT" and bad["audit_id"]
    assert by_request["log-traced-1"]["trace_id"] == trace_id
    assert by_request["log-traced-1"]["audit_id"] == traced.audit_id
