"""A thinking model behind a real server (issue 56): a tiny random-weight model of Qwen3's shape (the model opens
``<think>`` itself, ``enable_thinking`` in its template) served over gRPC and HTTP, asked as clients ask: the openai
SDK's chat (``thinking_token_budget``, ``reasoning_effort``, ``chat_template_kwargs``), unary and streamed, the
Responses API's ``reasoning``, and gRPC's ``reasoning``. The answer is valid JSON after the thought, the thought
comes apart and within its budget, and a replay of the record is exact."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.requirements import require_module
from helpers.thinking import save_thinking_model

from proctor.config import Settings
from proctor_client import ProctorClient
from proctor_client.v1 import audit_pb2, audit_pb2_grpc

openai = require_module("openai", "the official openai client (pip install -e '.[dev]')")

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer"}},
        "required": ["city", "rank"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
ASK = [{"role": "user", "content": "Name a city and its rank."}]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def thinking_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from proctor.app import BackgroundServer

    tmp = tmp_path_factory.mktemp("thinking")
    served = save_thinking_model(model_dir, "model_opens", tmp / "model")
    settings = Settings.load({"port": 0, "host": "127.0.0.1", "http_port": _free_port(), "model": str(served),
                              "audit_db": str(tmp / "audit.db"), "warmup": False})
    server = BackgroundServer(settings).start(timeout_s=300)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sdk(thinking_server: Any) -> Any:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{thinking_server.settings.http_port}/v1", api_key="none")


@pytest.fixture(scope="module")
def model_id(sdk: Any) -> str:
    return str(sdk.models.list().data[0].id)


def test_the_chat_answer_is_valid_json_after_a_bounded_thought(sdk: Any, model_id: str) -> None:
    answer = sdk.chat.completions.create(model=model_id, messages=ASK, response_format=FORMAT, max_tokens=120,
                                         temperature=1.0, seed=7, extra_body={"thinking_token_budget": 8})
    message = answer.choices[0].message
    assert json.loads(message.content).keys() == {"city", "rank"}
    thought = message.model_extra["reasoning_content"]
    assert thought == message.model_extra["reasoning"] and "think>" not in thought and "think>" not in message.content
    used = answer.usage.completion_tokens_details.reasoning_tokens
    assert used == 8 + 2  # the budget's tokens and the two markers
    assert answer.model_extra["proctor"]["schema_validation"]["valid"] is True


def test_a_streamed_thought_comes_apart_from_the_answer(sdk: Any, model_id: str) -> None:
    stream = sdk.chat.completions.create(model=model_id, messages=ASK, response_format=FORMAT, max_tokens=120,
                                         temperature=1.0, seed=8, stream=True,
                                         stream_options={"include_usage": True},
                                         extra_body={"thinking_token_budget": 6})
    thought, content, usage = [], [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            thought.append(extra.get("reasoning_content") or "")
            content.append(choice.delta.content or "")
    assert json.loads("".join(content)).keys() == {"city", "rank"}
    assert usage is not None and usage.completion_tokens_details.reasoning_tokens == 6 + 2
    assert "think>" not in "".join(thought)


def test_max_tokens_that_run_short_in_the_thought_still_close_the_answer_valid(sdk: Any, model_id: str) -> None:
    answer = sdk.chat.completions.create(model=model_id, messages=ASK, response_format=FORMAT, max_tokens=40,
                                         temperature=1.0, seed=9)
    assert answer.usage.completion_tokens <= 40
    assert answer.usage.completion_tokens_details.reasoning_tokens > 0
    assert json.loads(answer.choices[0].message.content).keys() == {"city", "rank"}


def test_thinking_off_and_excluded_thoughts(sdk: Any, model_id: str) -> None:
    off = sdk.chat.completions.create(model=model_id, messages=ASK, response_format=FORMAT, max_tokens=80,
                                      extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.usage.completion_tokens_details.reasoning_tokens == 0
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})
    excluded = sdk.chat.completions.create(model=model_id, messages=ASK, response_format=FORMAT, max_tokens=80,
                                           extra_body={"reasoning": {"max_tokens": 4, "exclude": True}})
    assert excluded.usage.completion_tokens_details.reasoning_tokens == 4 + 2
    assert "reasoning_content" not in (excluded.choices[0].message.model_extra or {})


def test_template_kwargs_the_template_cannot_take_are_a_400_naming_them(sdk: Any, model_id: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model=model_id, messages=ASK, max_tokens=8,
                                    extra_body={"chat_template_kwargs": {"tone": "brisk"}})
    assert caught.value.body["param"] == "chat_template_kwargs.tone"
    with pytest.raises(openai.BadRequestError) as effort:
        sdk.chat.completions.create(model=model_id, messages=ASK, max_tokens=8, reasoning_effort="extreme")
    assert effort.value.body["param"] == "reasoning_effort"


def test_the_responses_api_gives_a_reasoning_item_then_the_message(sdk: Any, model_id: str) -> None:
    response = sdk.responses.create(model=model_id, input="Name a city and its rank.", max_output_tokens=120,
                                    reasoning={"effort": "low", "max_tokens": 5}, temperature=1.0,
                                    text={"format": {"type": "json_schema", "name": "city", "schema": CITY,
                                                     "strict": True}})
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"]
    assert response.usage.output_tokens_details.reasoning_tokens == 5 + 2
    assert json.loads(response.output_text).keys() == {"city", "rank"}


def test_grpc_reasoning_and_an_exact_replay(thinking_server: Any) -> None:
    with ProctorClient(thinking_server.address, timeout_s=120.0) as client:
        assert client.model_info().reasoning_parser == "qwen3"  # auto: the model opens its own section
        result = client.generate(messages=[("user", "Name a city and its rank.")], json_schema=CITY,
                                 max_new_tokens=120, temperature=1.0, seed=21, reasoning_max_tokens=7)
    assert result.usage.reasoning_tokens == 7 + 2 and result.reasoning_text
    assert json.loads(result.text).keys() == {"city", "rank"}
    channel = grpc.insecure_channel(thinking_server.address)
    try:
        audit = audit_pb2_grpc.AuditStub(channel)
        record = json.loads(audit.GetRecord(audit_pb2.GetRecordRequest(audit_id=result.audit_id)).record_json)
        assert record["reasoning"]["tokens"] == 9 and record["reasoning"]["text"] == result.reasoning_text
        assert record["request"]["reasoning"]["max_tokens"] == 7
        replay = audit.Replay(audit_pb2.ReplayRequest(audit_id=result.audit_id), timeout=120)
        assert replay.exact_match, replay.message
    finally:
        channel.close()


def test_a_required_tool_call_follows_the_thought(sdk: Any, model_id: str) -> None:
    tool = {"type": "function", "function": {"name": "rank_city", "parameters": CITY}}
    answer = sdk.chat.completions.create(model=model_id, messages=ASK, tools=[tool], tool_choice="required",
                                         parallel_tool_calls=False, max_tokens=150, temperature=1.0, seed=4,
                                         extra_body={"thinking_token_budget": 5})
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "rank_city" and json.loads(call.function.arguments).keys() == {"city", "rank"}
    assert answer.usage.completion_tokens_details.reasoning_tokens == 5 + 2
    assert choice.message.model_extra["reasoning_content"]
