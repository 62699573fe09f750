"""The OpenAI-compatible HTTP API with the official ``openai`` client against a real server (real model, a
callers file, the audit trail, the metrics endpoint): chat and completions, unary and streamed, a strict
json_schema, a required tool call, logprobs, seeds, the audit id shown and replayed, and the errors
(401, 403, 429, 400 naming the field) in OpenAI's error object. Raw SSE is read with httpx."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.requirements import require_module

from proctor.config import Settings
from proctor_client.v1 import audit_pb2, audit_pb2_grpc

openai = require_module("openai", "the official openai client (pip install -e '.[dev]')")
httpx = require_module("httpx", "httpx (pip install -e '.[dev]')")
jsonschema = require_module("jsonschema")

pytestmark = pytest.mark.real_model
REPO = Path(__file__).resolve().parents[2]
WRITER, READER, LIMITED, REPLAYER = "writer-token", "reader-token", "limited-token", "replayer-token"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string",
                                                                                   "maxLength": 30}},
                                                           "required": ["city"], "additionalProperties": False}}}


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def http_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from proctor.app import BackgroundServer

    tmp = tmp_path_factory.mktemp("openai-http")
    callers = tmp / "callers.yaml"
    callers.write_text(f"""callers:
  - name: writer
    token_sha256: {_sha(WRITER)}
    roles: [generate]
  - name: reader
    token_sha256: {_sha(READER)}
    roles: [audit:read]
  - name: limited
    token_sha256: {_sha(LIMITED)}
    roles: [generate]
    limits: {{requests_per_second: 0.01, burst: 1}}
  - name: replayer
    token_sha256: {_sha(REPLAYER)}
    roles: [audit:read, audit:replay]
""")
    settings = Settings.load({"port": 0, "host": "127.0.0.1", "http_port": _free_port(),
                              "metrics_port": _free_port(), "callers_file": str(callers),
                              "audit_db": str(tmp / "audit.db")})
    server = BackgroundServer(settings).start(timeout_s=300)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def base_url(http_server: Any) -> str:
    return f"http://127.0.0.1:{http_server.settings.http_port}"


@pytest.fixture(scope="module")
def client(base_url: str) -> Any:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=WRITER, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client: Any) -> str:
    models = client.models.list().data
    assert len(models) == 1 and models[0].object == "model"
    return str(models[0].id)


def _chat(client: Any, model_id: str, text: str, **options: Any) -> Any:
    return client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": text}], **options)


def test_chat_and_completions_unary(client: Any, model_id: str) -> None:
    chat = _chat(client, model_id, "Say hello.", max_tokens=8, temperature=0)
    choice = chat.choices[0]
    assert chat.object == "chat.completion" and choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert chat.usage.completion_tokens <= 8 and chat.usage.prompt_tokens > 0
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    completion = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=5,
                                           temperature=0)
    assert completion.object == "text_completion" and completion.choices[0].text
    assert completion.usage.completion_tokens <= 5
    several = _chat(client, model_id, "Name a colour.", max_tokens=6, temperature=1.0, seed=11, n=2)
    assert [c.index for c in several.choices] == [0, 1] and all(c.message.content for c in several.choices)
    streamed = [c for c in _chat(client, model_id, "Name a colour.", max_tokens=6, temperature=1.0, seed=11, n=2,
                                 stream=True) if c.choices]
    for choice in several.choices:
        assert "".join(c.choices[0].delta.content or "" for c in streamed
                       if c.choices[0].index == choice.index) == choice.message.content


def test_streams_give_the_unary_text(client: Any, model_id: str) -> None:
    unary = _chat(client, model_id, "Count to five.", max_tokens=12, temperature=0)
    chunks = list(_chat(client, model_id, "Count to five.", max_tokens=12, temperature=0, stream=True,
                        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == unary.choices[0].message.content
    finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finished) == 1 and finished[0].choices[0].finish_reason == unary.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == unary.usage.completion_tokens
    pieces = list(client.completions.create(model=model_id, prompt="One, two,", max_tokens=6, temperature=0,
                                            stream=True))
    whole = client.completions.create(model=model_id, prompt="One, two,", max_tokens=6, temperature=0)
    assert "".join(p.choices[0].text for p in pieces) == whole.choices[0].text


def test_a_strict_json_schema_answer_validates(client: Any, model_id: str) -> None:
    response = _chat(client, model_id, "Describe a person as JSON.", max_tokens=80, temperature=0.7, seed=5,
                     response_format={"type": "json_schema",
                                      "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(response.choices[0].message.content), PERSON)
    facts = response.model_extra["proctor"]
    assert facts["constraint"]["kind"] == "json_schema" and facts["schema_validation"]["valid"] is True


def test_json_object_mode_gives_a_json_object(client: Any, model_id: str) -> None:
    response = _chat(client, model_id, "Reply in JSON.", max_tokens=40, seed=2,
                     response_format={"type": "json_object"})
    if response.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(response.choices[0].message.content), dict)


def _record(http_server: Any, audit_id: str) -> dict[str, Any]:
    """The record of ``audit_id`` (read with the replayer's token)."""
    with grpc.insecure_channel(http_server.address) as channel:
        record = audit_pb2_grpc.AuditStub(channel).GetRecord(
            audit_pb2.GetRecordRequest(audit_id=audit_id), metadata=(("authorization", f"Bearer {REPLAYER}"),))
        return dict(json.loads(record.record_json))


def _replayed(http_server: Any, audit_id: str) -> Any:
    """The record of ``audit_id`` and its replay through the Audit service."""
    with grpc.insecure_channel(http_server.address) as channel:
        audit = audit_pb2_grpc.AuditStub(channel)
        metadata = (("authorization", f"Bearer {REPLAYER}"),)
        record = json.loads(audit.GetRecord(audit_pb2.GetRecordRequest(audit_id=audit_id),
                                            metadata=metadata).record_json)
        return record, audit.Replay(audit_pb2.ReplayRequest(audit_id=audit_id), metadata=metadata, timeout=120)


def test_a_required_tool_call_parses_and_validates(client: Any, model_id: str, http_server: Any) -> None:
    response = _chat(client, model_id, "What is the weather in Paris?", max_tokens=60, tools=[WEATHER],
                     tool_choice="required", parallel_tool_calls=False, seed=1)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    record, replay = _replayed(http_server, response.model_extra["proctor"]["audit_id"])
    assert json.loads(record["request"]["tools_json"]) == [WEATHER] and replay.exact_match, replay


def test_a_streamed_tool_call_gives_its_arguments_in_deltas(client: Any, model_id: str) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    unary = _chat(client, model_id, "Weather in Rome?", max_tokens=60, tools=[WEATHER], tool_choice=named, seed=4)
    chunks = list(_chat(client, model_id, "Weather in Rome?", max_tokens=60, tools=[WEATHER], tool_choice=named,
                        seed=4, stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == json.loads(unary.choices[0].message.tool_calls[0].function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_logprobs_are_given(client: Any, model_id: str) -> None:
    response = _chat(client, model_id, "Hi", max_tokens=4, logprobs=True, top_logprobs=3, temperature=0)
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 3 for t in content)
    assert content[0].top_logprobs[0].token == content[0].token  # greedy: the most likely token was chosen
    completion = client.completions.create(model=model_id, prompt="Hi", max_tokens=3, logprobs=2, temperature=0)
    assert len(completion.choices[0].logprobs.tokens) == completion.usage.completion_tokens
    assert all(len(top) == 2 for top in completion.choices[0].logprobs.top_logprobs)


def test_a_seed_reproduces_a_sampled_answer(client: Any, model_id: str) -> None:
    answers = {_chat(client, model_id, "Tell me a story.", max_tokens=16, temperature=1.0, seed=1234)
               .choices[0].message.content for _ in range(2)}
    other = _chat(client, model_id, "Tell me a story.", max_tokens=16, temperature=1.0, seed=99).choices[0]
    assert len(answers) == 1 and other.message.content not in answers


def test_the_audit_id_is_shown_and_replayed_exactly(client: Any, model_id: str, http_server: Any) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model_id, messages=[{"role": "user", "content": "A haiku about audits."}], max_tokens=12,
        temperature=0.9, seed=7, extra_body={"forbidden": {"phrases": ["paper"]}})
    audit_id = raw.headers["x-proctor-audit-id"]
    response = raw.parse()
    assert response.model_extra["proctor"]["audit_id"] == audit_id
    env = {"PYTHONPATH": f"{REPO / 'service'}:{REPO / 'clients' / 'python' / 'src'}", "PATH": "/usr/bin:/bin"}
    shown = subprocess.run([sys.executable, "-m", "proctor.cli", "audit", "show", audit_id, "--db",
                            http_server.settings.audit_db], env=env, text=True, capture_output=True, timeout=300,
                           cwd=REPO)
    assert shown.returncode == 0, shown.stderr
    assert "POST /v1/chat/completions" in shown.stdout and audit_id in shown.stdout
    record, replay = _replayed(http_server, audit_id)
    assert record["method"] == "POST /v1/chat/completions" and record["request"]["forbidden"]["phrases"] == ["paper"]
    assert replay.exact_match and replay.steps_compared == response.usage.completion_tokens, replay
    assert record["output"]["text"] == response.choices[0].message.content
    from proctor.audit.chain import load_or_create_signing_key, log_signer
    from proctor.audit.setup import signing_key_path
    from proctor_client.tlog.receipt import verify_receipt

    settings = http_server.settings  # the log's receipt came in the answer's proctor extension
    verifier = log_signer(load_or_create_signing_key(signing_key_path(settings)), settings.audit_origin).verifier
    verify_receipt(response.model_extra["proctor"]["receipt"], verifier, audit_id=audit_id,
                   output=response.choices[0].message.content)


STORY = {"type": "object", "properties": {"story": {"type": "string"},
                                          "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
         "required": ["story", "tags"], "additionalProperties": False}


def test_a_json_answer_short_of_tokens_is_closed_valid_and_replays(client: Any, model_id: str,
                                                                   http_server: Any) -> None:
    """Issue 45 through the OpenAI SDK: a story that runs long is ended with its shortest valid ending; the SDK's
    parse() takes it (finish_reason "stop"), the extension says it was closed, and the record replays exactly."""
    from pydantic import BaseModel

    class Story(BaseModel):
        story: str
        tags: list[str]

    story_format = {"type": "json_schema", "json_schema": {"name": "story", "schema": STORY, "strict": True}}
    raw = client.chat.completions.with_raw_response.create(
        model=model_id, messages=[{"role": "user", "content": "Tell a very long story about a lighthouse, as JSON."}],
        max_tokens=40, temperature=0, response_format=story_format)
    response = raw.parse()
    choice, facts = response.choices[0], response.model_extra["proctor"]
    assert choice.finish_reason == "stop" and facts["finish_reason"] == "FINISH_REASON_CLOSED_AT_BUDGET"
    assert int(facts["usage"]["closing_tokens"]) > 0 and response.usage.completion_tokens <= 40
    document = json.loads(choice.message.content)
    jsonschema.validate(document, STORY)
    assert len(document["tags"]) >= 2 and facts["schema_validation"]["valid"] is True
    record, replay = _replayed(http_server, raw.headers["x-proctor-audit-id"])
    assert record["finish"]["reason"] == "closed_at_budget" and replay.exact_match, replay.message
    parsed = client.chat.completions.parse(  # the SDK's structured output: raises on "length", takes this
        model=model_id, messages=[{"role": "user", "content": "Tell a very long story about a lighthouse."}],
        max_tokens=40, temperature=0, response_format=Story)
    assert isinstance(parsed.choices[0].message.parsed, Story)
    cut = _chat(client, model_id, "Tell a very long story about a lighthouse, as JSON.", max_tokens=40,
                temperature=0, response_format=story_format, extra_body={"close_at_budget": False})
    assert cut.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as small:
        _chat(client, model_id, "x", max_tokens=5, response_format=story_format)
    assert small.value.body["param"] == "max_tokens" and "at least" in small.value.body["message"]


def test_unknown_token_wrong_role_and_overload(base_url: str, model_id: str) -> None:
    def chat_as(token: str) -> Any:
        other = openai.OpenAI(base_url=f"{base_url}/v1", api_key=token, max_retries=0)
        return _chat(other, model_id, "Hi", max_tokens=2)

    with pytest.raises(openai.AuthenticationError) as unknown:
        chat_as("no-such-token")
    assert unknown.value.status_code == 401 and unknown.value.body["type"] == "authentication_error"
    with pytest.raises(openai.PermissionDeniedError) as wrong:
        chat_as(READER)
    assert wrong.value.status_code == 403 and "generate" in wrong.value.body["message"]
    chat_as(LIMITED)  # its burst of one
    with pytest.raises(openai.RateLimitError) as limited:
        chat_as(LIMITED)
    assert limited.value.status_code == 429 and int(limited.value.response.headers["retry-after"]) >= 1


def test_the_responses_route_keeps_the_doors_guarantees(base_url: str, model_id: str, http_server: Any) -> None:
    """Callers, roles, the audit record (its method is the route), the metrics by route and a trace id."""
    def respond(token: str, **options: Any) -> Any:
        other = openai.OpenAI(base_url=f"{base_url}/v1", api_key=token, max_retries=0, timeout=120)
        return other.responses.create(model=model_id, input="Hi", max_output_tokens=8, **options)

    with pytest.raises(openai.AuthenticationError):
        respond("no-such-token")
    with pytest.raises(openai.PermissionDeniedError):
        respond(READER)
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    answered = respond(WRITER, extra_headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"},
                       text={"format": {"type": "json_schema", "name": "s", "schema": schema, "strict": True}})
    record = _record(http_server, answered.model_extra["proctor"]["audit_id"])
    assert record["method"] == "POST /v1/responses" and record["caller"]["identity"] == "writer"
    in_force = record["request"]["constraint"]  # the schema served (closed) and how: strict, so exact only
    assert json.loads(in_force["text"]) == {**schema, "additionalProperties": False} and in_force["exact_only"]
    assert record["constraint"]["exact"] is True
    assert record.get("trace_id") == trace, record.get("trace_id")
    with urllib.request.urlopen(f"http://127.0.0.1:{http_server.settings.metrics_port}/metrics", timeout=10) as got:
        assert 'method="/v1/responses"' in got.read().decode()


def test_a_bad_schema_is_a_400_naming_the_keyword(client: Any, model_id: str) -> None:
    bad = {"type": "object", "properties": {"age": {"type": "integer", "minimum": "zero"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(client, model_id, "x", max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "bad", "schema": bad, "strict": True}})
    error = refused.value.body
    assert error["param"].startswith("response_format.json_schema.schema")
    assert "'minimum'" in error["message"] and "/properties/age/minimum" in error["message"]


def test_fields_are_named_as_the_body_sent_them(client: Any, model_id: str) -> None:
    with pytest.raises(openai.BadRequestError) as stop:
        _chat(client, model_id, "x", max_tokens=4, stop=["ok", ""])
    assert stop.value.body["param"].startswith("stop")
    with pytest.raises(openai.BadRequestError) as extension:
        _chat(client, model_id, "x", max_tokens=4, extra_body={"top_k": -3})
    assert extension.value.body["param"] == "top_k"
    with pytest.raises(openai.BadRequestError) as unknown:
        _chat(client, model_id, "x", max_tokens=4, extra_body={"no_such_option": True})
    assert unknown.value.body["param"] == "no_such_option"
    with pytest.raises(openai.NotFoundError) as model:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert model.value.body["code"] == "model_not_found"


def test_raw_sse_order_done_and_usage(base_url: str, model_id: str) -> None:
    body = {"model": model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {WRITER}"}) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-proctor-audit-id"]
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    finish = [i for i, e in enumerate(events) if e["choices"] and e["choices"][0]["finish_reason"]]
    assert finish == [len(events) - 2]  # the finish, then the usage chunk
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] >= 1
    assert all(e["usage"] is None for e in events[:-1])
    assert events[finish[0]]["proctor"]["audit_id"] == response.headers["x-proctor-audit-id"]


def test_health_ready_and_metrics_by_route(base_url: str, http_server: Any, client: Any, model_id: str) -> None:
    assert httpx.get(f"{base_url}/health").json() == {"status": "SERVING"}
    assert httpx.get(f"{base_url}/ready").status_code == 200
    missing = httpx.get(f"{base_url}/v2/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    _chat(client, model_id, "Hi", max_tokens=2)
    port = http_server.settings.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as scraped:
        text = scraped.read().decode()
    assert 'service="openai"' in text and 'method="/v1/chat/completions"' in text


def test_fuzzed_bodies_get_a_400_naming_a_param_never_a_500(base_url: str, model_id: str) -> None:
    """Random values under every key a chat body may hold (and some it may not): 0 answers 500, and every
    refused body is a 400 whose error names the param."""
    hypothesis = require_module("hypothesis")
    st = hypothesis.strategies
    from proctor.openai_http.body import CHAT, KEYS
    from proctor.openai_http.fields import EXTENSIONS

    lengths = {"max_tokens", "max_completion_tokens", "min_new_tokens", "n", "num_beams"}  # kept small: fast
    keys = sorted((KEYS[CHAT] | EXTENSIONS.keys() | {"unknown_key", "functions"}) - lengths - {"model", "messages"})
    leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.integers(),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
                     st.sampled_from(["on", "lark", "auto", "required", "json_object"]))
    value = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(
                                                           ["type", "name", "phrases", "text", "schema",
                                                            "function", "include_usage", "syntax"]), inner,
                                                           max_size=3)), max_leaves=6)
    bodies = st.fixed_dictionaries(
        {"model": st.sampled_from([model_id, model_id, "other"]),
         "messages": st.one_of(st.just([{"role": "user", "content": "Hi"}]), value),
         "max_tokens": st.integers(0, 2)},
        optional={key: value for key in keys} | {key: st.integers(-1, 2) for key in lengths - {"max_tokens"}})
    seen: dict[int, int] = {}

    @hypothesis.settings(max_examples=150, deadline=None, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(body=bodies)
    def post(body: dict[str, Any]) -> None:
        response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120,
                              headers={"Authorization": f"Bearer {WRITER}"})
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code in (200, 400, 404), (response.status_code, response.text, body)
        if response.status_code != 200:
            error = response.json()["error"]
            assert error["param"], (error, body)

    post()
    assert seen.get(400, 0) > 0 and seen.get(200, 0) > 0, seen


def test_a_client_that_leaves_a_stream_frees_the_engine_and_is_recorded(base_url: str, model_id: str,
                                                                        http_server: Any) -> None:
    body = {"model": model_id, "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 2000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {WRITER}"}) as response:
        audit_id = response.headers["x-proctor-audit-id"]
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    engine = http_server.running.engine
    deadline = time.monotonic() + 30
    while engine.active_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.active_count() == 0
    record = None
    while record is None and time.monotonic() < deadline:
        try:
            record = _record(http_server, audit_id)
        except grpc.RpcError:
            time.sleep(0.1)
    assert record is not None and record["status"]["code"] == "CANCELLED"
    assert 0 < len(record["tokens"]) < 2000  # what was generated before the client left, and no more


def test_the_callers_trace_reaches_the_audit_record(base_url: str, model_id: str, http_server: Any) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    response = httpx.post(f"{base_url}/v1/completions", timeout=120, json={
        "model": model_id, "prompt": "Hello", "max_tokens": 2},
        headers={"Authorization": f"Bearer {WRITER}", "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    assert response.status_code == 200
    record = _record(http_server, response.headers["x-proctor-audit-id"])
    assert record["trace_id"] == trace_id and record["method"] == "POST /v1/completions"
