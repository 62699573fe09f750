"""The OpenAI-compatible HTTP door without a model: the field table covers the proto, bodies convert or are
refused naming their key, tool calls stream as deltas, and the door's own answers (health, drain, sizes,
unknown routes, a model still loading) are OpenAI error objects, never a traceback."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from helpers.requirements import require_module

from proctor.config import Settings
from proctor.domain import ConstraintRequest
from proctor.openai_http.body import CHAT, COMPLETION, ParsedCall, parse_body
from proctor.openai_http.errors import BodyError
from proctor.openai_http.fields import EXTENSIONS, STANDARD, param_of
from proctor.openai_http.tools import CallStream, parse_output, tool_plan
from proctor_client.v1 import generation_pb2 as pb

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def proto_leaves() -> list[str]:
    """Every field the tables must cover: GenerateRequest's, with sampling's and stopping's by path."""
    nested = {"sampling": pb.SamplingParams.DESCRIPTOR, "stopping": pb.StoppingParams.DESCRIPTOR}
    leaves = []
    for field in pb.GenerateRequest.DESCRIPTOR.fields:
        inner = nested.get(field.name)
        leaves.extend([f"{field.name}.{f.name}" for f in inner.fields] if inner is not None else [field.name])
    return leaves


def constraint(call: ParsedCall) -> ConstraintRequest | None:
    return call.draft.request().constraint


def schema_of(call: ParsedCall) -> Any:
    """The JSON schema the call is constrained to: its text and its object, the same schema."""
    found = constraint(call)
    assert found is not None and found.kind == "json_schema" and found.parsed == (json.loads(found.text),)
    return found.parsed[0]


def grammar_of(call: ParsedCall) -> str:
    found = constraint(call)
    assert found is not None and found.kind == "grammar" and found.grammar_syntax == "lark"
    return found.text


def test_every_proto_field_is_standard_or_an_extension() -> None:
    covered = set(STANDARD) | set(EXTENSIONS.values())
    assert set(proto_leaves()) - covered == set(), "a GenerateRequest field the HTTP body cannot set"
    assert not set(STANDARD) & set(EXTENSIONS.values()), "a field set two ways"
    assert covered - set(proto_leaves()) == set(), "a table entry for a field the proto lacks"


def test_violations_are_named_by_the_body_key() -> None:
    assert param_of("stopping.stop[2]") == "stop[2]"
    assert param_of("sampling.temperature") == "temperature"
    assert param_of("sampling.top_k") == "top_k"
    assert param_of("messages.messages[1].role") == "messages[1].role"
    assert param_of("forbidden.phrases[0]") == "forbidden.phrases[0]"
    assert param_of("json_schema", {"json_schema": "tools"}) == "tools"


def test_a_chat_body_converts_with_standard_fields_and_extensions() -> None:
    call = parse_body(chat(max_completion_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop="END", n=1,
                           presence_penalty=0.1, frequency_penalty=0.2, logit_bias={"42": -100},
                           logprobs=True, top_logprobs=2, user="alice", speculation="off", top_k=5,
                           forbidden={"phrases": ["x"], "case_insensitive": False},
                           grammar={"syntax": "lark", "text": 'start: "a"'}), CHAT)
    r = call.draft.request()
    assert r.stopping.max_new_tokens == 7 and r.stopping.stop == ("END",)
    assert r.sampling.temperature == 0.5 and r.sampling.seed == 3 and r.sampling.top_k == 5
    assert r.sampling.top_p == pytest.approx(0.9) and r.sampling.top_p != 0.9  # a 32-bit float, as on gRPC
    assert r.logit_bias == ((42, -100.0),) and r.token_details and r.top_logprobs == 2
    assert r.speculation == "off" and r.constraint is not None and r.constraint.grammar_syntax == "lark"
    assert r.forbidden.phrases == ("x",) and not r.forbidden.case_insensitive
    assert call.user == "alice" and call.logprobs


@pytest.mark.parametrize(("body", "param"), [
    (chat(temperature="warm"), "temperature"),
    (chat(bogus=1), "bogus"),
    (chat(max_tokens=True), "max_tokens"),
    (chat(messages=[]), "messages"),
    (chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0].content[0]"),
    (chat(stream_options={"include_usage": True}), "stream_options"),
    (chat(top_logprobs=3), "top_logprobs"),
    (chat(logit_bias={"abc": 1}), "logit_bias[abc]"),
    (chat(seed=-1), "seed"),
    (chat(regex="a+", choice={"options": ["a"]}), "choice"),
    (chat(regex="a+", response_format={"type": "json_object"}), "regex"),
    (chat(response_format={"type": "xml"}), "response_format.type"),
    (chat(speculation="sideways"), "speculation"),
    (chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice.function.name"),
    (chat(tool_choice="required"), "tool_choice"),
    ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
    ([1, 2], "body"),
])
def test_bad_bodies_name_their_key(body: Any, param: str) -> None:
    kind = COMPLETION if isinstance(body, dict) and "prompt" in body else CHAT
    with pytest.raises(BodyError) as refused:
        parse_body(body, kind)
    assert refused.value.param == param and refused.value.status == 400


def test_every_json_schema_is_enforced_and_strict_refuses_the_fallback() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    loose = parse_body(chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}),
                       CHAT)
    assert schema_of(loose) == {**schema, "additionalProperties": False}
    assert not constraint(loose).exact_only and loose.schema is not None and loose.schema.closed == ("#",)  # type: ignore[union-attr]
    strict = parse_body(chat(response_format={"type": "json_schema",
                                              "json_schema": {"name": "s", "schema": schema, "strict": True}}), CHAT)
    assert constraint(strict).exact_only and strict.params["json_schema"] == "response_format.json_schema.schema"  # type: ignore[union-attr]
    kept_open = {**schema, "additionalProperties": True}
    as_sent = parse_body(chat(response_format={"type": "json_schema", "json_schema": {"name": "s",
                                                                                     "schema": kept_open}}), CHAT)
    assert schema_of(as_sent) == kept_open and as_sent.schema.closed == ()  # type: ignore[union-attr]


def test_tools_constrain_the_call_by_choice() -> None:
    required = parse_body(chat(tools=[TOOL], tool_choice="required", parallel_tool_calls=False), CHAT)
    schema = schema_of(required)
    assert schema["properties"]["name"] == {"const": "lookup"} and schema["properties"]["arguments"] == \
        {**TOOL["function"]["parameters"], "additionalProperties": False}  # type: ignore[dict-item]
    assert json.loads(required.draft.request().tools_json) == [TOOL] and not constraint(required).exact_only  # type: ignore[union-attr]
    several = parse_body(chat(tools=[TOOL], tool_choice="required"), CHAT)  # parallel calls: OpenAI's default
    assert grammar_of(several).startswith('start: calls\ncalls: block ("\\n" block)*\nblock: "<tool_call>" call')
    auto = parse_body(chat(tools=[TOOL]), CHAT)
    assert "%json" in grammar_of(auto) and '"whitespace_flexible": false' in grammar_of(auto)
    one = parse_body(chat(tools=[TOOL], parallel_tool_calls=False), CHAT)
    assert grammar_of(one).startswith('start: TEXT | calls\ncalls: block\nblock: "<tool_call>" call "</tool_call>"\n')
    free = parse_body(chat(tools=[TOOL], tool_choice="none"), CHAT)
    assert constraint(free) is None
    strict_tool = {"type": "function", "function": {**TOOL["function"], "strict": True}}  # type: ignore[dict-item]
    strict = parse_body(chat(tools=[strict_tool], tool_choice="required"), CHAT)
    assert constraint(strict).exact_only and strict.schema.strict  # type: ignore[union-attr]
    assert strict.schema.closed == ("tools/lookup#",)  # type: ignore[union-attr]


def test_a_call_cut_short_is_returned_as_far_as_it_goes() -> None:
    tools = [TOOL, {"type": "function", "function": {"name": "list", "parameters": {"type": "object"}}}]
    plan = tool_plan({"tools": tools, "tool_choice": "required", "parallel_tool_calls": False})
    assert plan is not None
    _, calls = parse_output('{"name":"lookup","arguments":{"q":"Par', plan, cut=True)
    assert calls[0]["function"] == {"name": "lookup", "arguments": '{"q":"Par'}
    assert parse_output('{"name":"loo', plan, cut=True)[1][0]["function"] == {"name": "lookup", "arguments": ""}
    assert parse_output('{"name":"l', plan, cut=True) == ('{"name":"l', [])  # lookup or list: not known yet
    assert parse_output('{"name":"loo', plan) == ('{"name":"loo', [])  # not cut: not a call


def test_parallel_calls_are_parsed_and_streamed_each_with_its_index() -> None:
    plan = tool_plan({"tools": [TOOL], "tool_choice": "required"})
    assert plan is not None and plan.blocks
    output = ('<tool_call>{"name":"lookup","arguments":{"q":"a"}}</tool_call>\n'
              '<tool_call>{"name":"lookup","arguments":{"q":"b}"}}</tool_call>')
    content, calls = parse_output(output, plan)
    assert content is None and [json.loads(c["function"]["arguments"]) for c in calls] == [{"q": "a"}, {"q": "b}"}]
    stream = CallStream(plan)
    deltas = [d for piece in output for d in stream.feed(piece)[1]] + stream.finish()[1]
    by_index: dict[int, str] = {}
    for delta in deltas:
        by_index[delta["index"]] = by_index.get(delta["index"], "") + delta["function"]["arguments"]
    assert {i: json.loads(a) for i, a in by_index.items()} == {0: {"q": "a"}, 1: {"q": "b}"}}
    assert len({d["id"] for d in deltas if "id" in d}) == 2


def test_a_repeated_call_is_left_out_unary_and_streamed() -> None:
    plan = tool_plan({"tools": [TOOL], "tool_choice": "required"})
    assert plan is not None
    block = '<tool_call>{"name":"lookup","arguments":{"q":"a"}}</tool_call>'
    output = f'{block}\n{block.replace(":", ": ")}\n<tool_call>{{"name":"lookup","arguments":{{"q":"b"}}}}</tool_'
    _, calls = parse_output(output, plan, cut=True)
    assert [c["function"]["arguments"] for c in calls] == ['{"q":"a"}', '{"q":"b"}']  # the tag cut short is dropped
    stream = CallStream(plan)
    deltas = [d for piece in output for d in stream.feed(piece)[1]] + stream.finish()[1]
    streamed: dict[int, str] = {}
    for delta in deltas:
        streamed[delta["index"]] = streamed.get(delta["index"], "") + delta["function"]["arguments"]
    assert streamed == {0: '{"q":"a"}', 1: '{"q":"b"}'}


def test_a_call_is_parsed_and_streamed_as_deltas() -> None:
    plan = tool_plan({"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False})
    assert plan is not None
    output = '{"name": "lookup", "arguments": {"q": "a}b"}}'
    content, calls = parse_output(output, plan)
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"q": "a}b"}
    stream = CallStream(plan)
    deltas = [d for piece in output for d in stream.feed(piece)[1]] + stream.finish()[1]
    assert deltas[0]["function"]["name"] == "lookup" and deltas[0]["id"].startswith("call_")
    assert json.loads("".join(d["function"]["arguments"] for d in deltas)) == {"q": "a}b"}


def test_auto_streams_text_or_a_tagged_call() -> None:
    plan = tool_plan({"tools": [TOOL]})
    assert plan is not None and plan.mode == "auto"
    text = CallStream(plan)
    released = "".join(text.feed(p)[0] for p in ("Hel", "lo ", "<b>")) + text.finish()[0]
    assert released == "Hello <b>" and not text.called
    call = CallStream(plan)
    pieces = ["<tool", "_call>", '{"name": "lookup", ', '"arguments": {"q": "z"}}', "</tool_call>"]
    released = [call.feed(p) for p in pieces] + [call.finish()]
    assert all(content == "" for content, _ in released) and call.called
    deltas = [d for _, found in released for d in found]
    assert deltas[0]["function"]["name"] == "lookup"
    assert json.loads("".join(d["function"]["arguments"] for d in deltas)) == {"q": "z"}
    assert parse_output("".join(pieces), plan)[1][0]["function"]["name"] == "lookup"


@pytest.fixture
def door() -> Any:
    require_module("httpx")
    from grpc_health.v1._async import HealthServicer
    from starlette.testclient import TestClient

    from proctor.api.admission import Admission
    from proctor.api.generation_service import GenerationService
    from proctor.api.observer import CallObserver
    from proctor.api.readiness import serving_of
    from proctor.openai_http.routes import HttpDoor

    settings = Settings.load({"max_message_bytes": 4096})
    health = HealthServicer()
    built = HttpDoor(settings, GenerationService(settings), Admission(None), CallObserver(None, None),
                     serving_of(health))
    with TestClient(built.app(), raise_server_exceptions=False) as client:
        yield client, health


def test_the_door_answers_in_openai_error_objects(door: Any) -> None:
    client, _health = door
    loading = client.post("/v1/chat/completions", json=chat(model="any"))
    assert loading.status_code in (404, 503) and set(loading.json()["error"]) == {"message", "type", "param", "code"}
    assert client.post("/v1/chat/completions", content=b"{not json").json()["error"]["param"] == "body"
    assert client.post("/v1/chat/completions", content=b'{"model": "m", "temperature": NaN}').status_code == 400
    big = client.post("/v1/chat/completions", content=b"{" + b" " * 5000 + b"}")
    assert big.status_code == 413 and big.json()["error"]["param"] == "body"
    assert client.get("/v1/nowhere").status_code == 404
    wrong = client.get("/v1/chat/completions")
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"
    assert client.get("/v1/models").status_code == 503  # the model is still loading


def test_health_follows_the_grpc_health_service_through_a_drain(door: Any) -> None:
    from grpc_health.v1 import health_pb2

    client, health = door
    asyncio.run(health.set("proctor.v1.Generation", health_pb2.HealthCheckResponse.SERVING))
    assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 200
    asyncio.run(health.enter_graceful_shutdown())
    assert client.get("/ready").json() == {"status": "NOT_SERVING"} and client.get("/ready").status_code == 503
    assert client.get("/health").status_code == 503


def test_the_listener_sends_each_chunk_at_once() -> None:
    """Accepted connections have TCP_NODELAY: otherwise a keep-alive request's first chunk waits for the
    client's delayed ACK (asyncio sets the option only where the listening socket's proto says TCP)."""
    import socket

    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from proctor.openai_http.server import HttpListener

    async def main() -> list[int]:
        app = Starlette(routes=[Route("/", lambda _: PlainTextResponse("ok"))])
        listener = HttpListener(app, Settings.load({"host": "127.0.0.1", "http_port": 0}))
        port = await listener.start()
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            await _reader.readuntil(b"ok")
            options = [conn.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                       for conn in listener.server.server_state.connections]
            writer.close()
            return options
        finally:
            await listener.stop()

    options = asyncio.run(main())
    assert options and all(options), f"TCP_NODELAY on the accepted connections: {options}"
