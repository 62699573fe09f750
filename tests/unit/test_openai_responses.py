"""The Responses API without a model: a Responses body reads as the chat body it means, errors name the keys
the caller sent, and chat stream chunks become the Responses events in order."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proctor.openai_http.errors import BodyError
from proctor.openai_http.responses import ResponseEvents, parse_responses

TOOL = {"type": "function", "name": "lookup", "strict": True,
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", **fields}


def test_a_responses_body_is_the_chat_call_it_means() -> None:
    call = parse_responses(body(instructions="Be brief.", max_output_tokens=7, temperature=0.5, tools=[TOOL],
                                tool_choice={"type": "function", "name": "lookup"}, store=False,
                                input=[{"role": "user", "content": [{"type": "input_text", "text": "a"}]},
                                       {"type": "function_call", "call_id": "call_1", "name": "lookup",
                                        "arguments": '{"q": "x"}'},
                                       {"type": "function_call_output", "call_id": "call_1", "output": "found"}]))
    request = call.draft.request()
    assert request.messages is not None and request.constraint is not None
    turns = [(m.role, m.content) for m in request.messages]
    assert turns[0] == ("system", "Be brief.") and turns[1] == ("user", "a")
    assert turns[2][0] == "assistant" and '"name": "lookup"' in turns[2][1]
    assert turns[3] == ("user", "<tool_response>\nfound\n</tool_response>")
    assert request.stopping.max_new_tokens == 7 and request.constraint.exact_only
    assert json.loads(request.constraint.text)["properties"]["name"] == {"const": "lookup"}
    assert call.responses_echo is not None and call.responses_echo["tools"] == [TOOL]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    formatted = parse_responses(body(text={"format": {"type": "json_schema", "name": "s", "schema": schema}}))
    constraint = formatted.draft.request().constraint
    assert constraint is not None and json.loads(constraint.text) == {**schema, "additionalProperties": False}
    assert formatted.params["json_schema"] == "text.format.schema"
    assert formatted.params["stopping.max_new_tokens"] == "max_output_tokens"


@pytest.mark.parametrize(("fields", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"frequency": 1}, "frequency"),
    ({"input": []}, "input"),
    ({"input": [{"type": "input_image"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"text": {"format": {"type": "json_schema", "name": "s", "strict": "yes"}}}, "text.format.strict"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"max_output_tokens": "many"}, "max_output_tokens"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"truncation": "sometimes"}, "truncation"),
])
def test_bad_responses_bodies_name_the_key_sent(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BodyError) as refused:
        parse_responses(body(**fields))
    assert refused.value.param == param, refused.value


def test_chat_chunks_become_responses_events_in_order() -> None:
    call = parse_responses(body(tools=[{**TOOL, "strict": False}]))
    events = ResponseEvents(call, created=1)
    out = list(events.start("r1"))
    frame = {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}
    out += list(events.feed(frame)) + list(events.feed({"choices": [{"index": 0, "delta": {"content": "lo"}}]}))
    out += events.feed({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_9", "type": "function", "function": {"name": "lookup", "arguments": ""}}]}}]})
    out += events.feed({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": '{"q":"z"}'}}]}}]})
    final = {"choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {}}], "proctor": {"audit_id": "a"}}
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
             "prompt_tokens_details": {"cached_tokens": 0}}
    out += events.finish(final, usage)
    names = [name for name, _ in out]
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.output_item.added", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [payload["sequence_number"] for _, payload in out] == list(range(len(out)))
    done = out[-1][1]["response"]
    assert [item["type"] for item in done["output"]] == ["message", "function_call"]
    assert done["output"][0]["content"][0]["text"] == "Hello" and done["output"][1]["arguments"] == '{"q":"z"}'
    assert done["usage"]["output_tokens"] == 4 and done["status"] == "completed" and done["id"] == "resp_r1"
