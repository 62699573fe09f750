"""The Responses API (``POST /v1/responses``): the ``openai`` SDK's newer surface and the Agents SDK's default.

A Responses body is read as the chat body it means (``input`` and ``instructions`` as messages, flat function
tools as chat tools, ``text.format`` as ``response_format``, ``max_output_tokens`` as ``max_tokens``) and then
checked and run by the chat route's own code, so the gate, callers, limits, constraints, metrics and audit are
the same. The chat answer is then given in the Responses shapes: a ``response`` object with ``message`` and
``function_call`` output items, or its stream of typed events (``response.created`` ... ``response.completed``).

Nothing is stored but the audit record: ``store`` is accepted either way, ``previous_response_id`` (and
``conversation``) are refused with a 400, as a response cannot be fetched again.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from proctor.openai_http.body import CHAT, ParsedCall, parse_body
from proctor.openai_http.errors import BodyError
from proctor.openai_http.fields import EXTENSIONS, VLLM_KEYS

# Responses body key → the chat body key it is (the rest of the body is read here).
SAME_KEYS = ("model", "temperature", "top_p", "seed", "user", "stream", "parallel_tool_calls", "top_logprobs",
             "metadata", "store", "service_tier")
RENAMED = {"max_output_tokens": "max_tokens"}
OWN_KEYS = frozenset({"input", "instructions", "text", "tools", "tool_choice", "include", "truncation",
                      "stream_options", "prompt_cache_key", "safety_identifier", "reasoning"})
REFUSED = {"previous_response_id": "responses are not stored here, so none can be continued: send the whole input",
           "conversation": "conversations are not stored here: send the whole input",
           "background": "background responses are not supported: the call answers when it is done",
           "prompt": "stored prompt templates are not supported: send the input"}
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Our finish reasons, as OpenAI names them in the chat answer → the Responses API's incomplete reason.
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
# Body keys as the chat route names them → as this route's caller sent them (errors' ``param``).
PARAM_NAMES = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}
PROTO_PARAMS = {"stopping.max_new_tokens": "max_output_tokens", "messages.messages": "input", "messages": "input",
                "token_details": "include"}


def parse_responses(raw: object) -> ParsedCall:
    """A Responses body, checked and converted through the chat route's parser; BodyError names the key sent."""
    if not isinstance(raw, dict):
        raise BodyError("the request body must be a JSON object", "body")
    for key, why in REFUSED.items():
        if raw.get(key) not in (None, False):
            raise BodyError(f"{key}: {why}", key)
    known = {*SAME_KEYS, *RENAMED, *OWN_KEYS, *REFUSED, *EXTENSIONS, *VLLM_KEYS}
    for key in raw:
        if key not in known:
            raise BodyError(f"Unrecognized request argument supplied: {key}", key)
    chat: dict[str, Any] = {key: raw[key] for key in (*SAME_KEYS, *EXTENSIONS, *VLLM_KEYS) if key in raw}
    chat.update({RENAMED[key]: raw[key] for key in RENAMED if key in raw})
    chat["messages"] = _instructions(raw.get("instructions")) + input_messages(raw.get("input"))
    _text(raw.get("text"), chat)
    _tools(raw, chat)
    _include(raw, chat)
    if raw.get("truncation") not in (None, "disabled", "auto"):
        raise BodyError('truncation must be "disabled" or "auto"', "truncation")
    if raw.get("truncation") == "auto":  # drop the oldest turns rather than refuse an input that does not fit
        chat.setdefault("context_overflow", "drop_oldest_turns")
    if raw.get("reasoning") is not None:  # {effort, max_tokens, ...}: read as the chat route reads it
        chat["reasoning"] = raw["reasoning"]
    try:
        call = parse_body(chat, CHAT)
    except BodyError as error:
        raise _renamed(error) from None
    echo = {"instructions": raw.get("instructions"), "max_output_tokens": raw.get("max_output_tokens"),
            "metadata": raw.get("metadata") or {}, "parallel_tool_calls": raw.get("parallel_tool_calls", True),
            "temperature": raw.get("temperature"), "top_p": raw.get("top_p"),
            "tool_choice": raw.get("tool_choice", "auto"), "tools": raw.get("tools") or [],
            "text": raw.get("text") or {"format": {"type": "text"}}, "truncation": raw.get("truncation", "disabled"),
            "store": False, "previous_response_id": None, "user": raw.get("user")}
    return dataclasses.replace(call, params={**PROTO_PARAMS, **{k: _rename(v) for k, v in call.params.items()}},
                               responses_echo=echo)


def _rename(param: str) -> str:
    param = re.sub(r"^tools\[(\d+)\]\.function", r"tools[\1]", param)  # flat function tools here
    for chat_name, own in PARAM_NAMES.items():
        if param == chat_name or param.startswith((f"{chat_name}.", f"{chat_name}[")):
            rest = param[len(chat_name):]
            if chat_name == "response_format":  # text.format is flat: its json_schema's keys sit beside type
                rest = rest.removeprefix(".json_schema")
            return own + rest
    return param


def _renamed(error: BodyError) -> BodyError:
    if error.param is None:
        return error
    own = _rename(error.param)
    return dataclasses.replace(error, message=error.message.replace(error.param, own), param=own)


def _instructions(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, str):
        raise BodyError("instructions must be a string", "instructions")
    return [{"role": "system", "content": value}]


def input_messages(value: object) -> list[dict[str, Any]]:
    """``input`` (a string, or message and function-call items) as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise BodyError("input must be a string or a non-empty array of items", "input")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _content(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "content": _content(output, f"{where}.output")})
        else:
            raise BodyError(f"{where}: items of type {kind!r} are not supported here (message, function_call and "
                            "function_call_output are)", where)
    return messages


def _content(content: object, where: str) -> str:
    """A message's content: a string, or text parts (``input_text``, ``output_text``, ``text``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BodyError(f"{where} must be a string or an array of text parts", where)
    texts = []
    for index, part in enumerate(content):
        if (not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text")
                or not isinstance(part.get("text"), str)):
            raise BodyError(f"{where}[{index}] must be {{\"type\": \"input_text\", \"text\": ...}}: this model reads "
                            "text only", f"{where}[{index}]")
        texts.append(part["text"])
    return "".join(texts)


def _text(value: object, chat: dict[str, Any]) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise BodyError("text must be an object", "text")
    fmt = value.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise BodyError("text.format must be an object", "text.format")
    if fmt.get("type") == "json_schema":  # flat here: name, schema and strict beside the type
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        chat["response_format"] = {"type": "json_schema", "json_schema": spec}
    else:
        chat["response_format"] = fmt


def _tools(raw: dict[str, Any], chat: dict[str, Any]) -> None:
    tools = raw.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BodyError("tools must be an array of function tools", "tools")
        converted = []
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                raise BodyError(f"tools[{index}]: only function tools are served here", f"tools[{index}]")
            converted.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
        chat["tools"] = converted or None
    choice = raw.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        chat["tool_choice"] = choice


def _include(raw: dict[str, Any], chat: dict[str, Any]) -> None:
    include = raw.get("include")
    if include is None:
        return
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise BodyError("include must be an array of strings", "include")
    if LOGPROBS_INCLUDE in include or raw.get("top_logprobs"):
        chat["logprobs"] = True


def response_object(answer: dict[str, Any], call: ParsedCall, status: str = "") -> dict[str, Any]:
    """The chat route's unary answer as a Responses ``response`` object."""
    choice = answer["choices"][0]
    message, reason = choice["message"], choice["finish_reason"]
    rid = answer["id"].removeprefix("chatcmpl-")
    items: list[dict[str, Any]] = []
    done = "incomplete" if reason in INCOMPLETE else "completed"
    if message.get("reasoning_content"):
        items.append(reasoning_item(rid, message["reasoning_content"], done))
    if message.get("content") or not message.get("tool_calls"):
        items.append(message_item(rid, message.get("content") or "", done, _logprobs(choice)))
    items += [function_call_item(call_["id"], call_["function"]["name"], call_["function"]["arguments"], done)
              for call_ in message.get("tool_calls") or ()]
    usage = answer["usage"]
    return {**envelope(rid, answer["created"], call, status or done), "output": items,
            "incomplete_details": {"reason": INCOMPLETE[reason]} if reason in INCOMPLETE else None,
            "usage": {"input_tokens": usage["prompt_tokens"],
                      "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},
                      "output_tokens": usage["completion_tokens"],
                      "output_tokens_details": {"reasoning_tokens": _reasoning_tokens(usage)},
                      "total_tokens": usage["total_tokens"]},
            "proctor": answer["proctor"]}


def envelope(rid: str, created: int, call: ParsedCall, status: str) -> dict[str, Any]:
    """A response object's own fields, before its output and usage are known."""
    echo = call.responses_echo or {}
    return {"id": f"resp_{rid}", "object": "response", "created_at": created, "status": status, "error": None,
            "incomplete_details": None, "model": call.model, "output": [], "usage": None, **echo}


def _reasoning_tokens(usage: dict[str, Any]) -> int:
    return int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0))


def reasoning_item(rid: str, text: str, status: str) -> dict[str, Any]:
    """A thinking model's thought as the Responses API's ``reasoning`` output item (its text, no summary)."""
    return {"type": "reasoning", "id": f"rs_{rid}", "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(rid: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{rid}", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}]}


def function_call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id.removeprefix('call_')}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _logprobs(choice: dict[str, Any]) -> list[dict[str, Any]]:
    found = choice.get("logprobs") or {}
    return [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"],
             "top_logprobs": t["top_logprobs"]} for t in found.get("content") or ()]


@dataclass
class ResponseEvents:
    """The chat route's stream chunks as the Responses API's events, each ``(event name, payload)``."""

    call: ParsedCall
    created: int
    rid: str = ""
    sequence: int = 0
    text: str = ""
    items: list[dict[str, Any]] = field(default_factory=list)
    _open: dict[str, Any] | None = None  # the item being written: a message or a function call

    def start(self, rid: str) -> Iterator[tuple[str, dict[str, Any]]]:
        self.rid = rid
        response = envelope(rid, self.created, self.call, "in_progress")
        yield self._event("response.created", response=response)
        yield self._event("response.in_progress", response=response)

    def feed(self, chunk: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """The events one chat stream chunk releases (its last carries the finish reason and our facts)."""
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                yield from self._thought(delta["reasoning_content"])
            if delta.get("content"):
                yield from self._text(delta["content"])
            for call in delta.get("tool_calls") or ():
                yield from self._call(call)

    def finish(self, final: dict[str, Any], usage: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """Close the open item and end with ``response.completed`` (or ``response.incomplete``)."""
        reason = final["choices"][0]["finish_reason"]
        status = "incomplete" if reason in INCOMPLETE else "completed"
        if self._open is None and not self.items:
            yield from self._text("")
        yield from self._close(status)
        answer = {"id": f"chatcmpl-{self.rid}", "created": self.created, "usage": usage, "proctor": final["proctor"],
                  "choices": [{"finish_reason": reason, "message": {}}]}
        response = response_object(answer, self.call, status)
        response["output"] = self.items
        yield self._event(f"response.{status}", response=response)

    def _text(self, piece: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if self._open is None or self._open["type"] != "message":
            yield from self._close("completed")
            self._open = message_item(self.rid, "", "in_progress")
            self._open["content"] = []
            yield self._event("response.output_item.added", output_index=len(self.items), item=self._open)
            yield self._event("response.content_part.added", item_id=self._open["id"], output_index=len(self.items),
                              content_index=0, part={"type": "output_text", "text": "", "annotations": []})
        self.text += piece
        if piece:
            yield self._event("response.output_text.delta", item_id=self._open["id"], output_index=len(self.items),
                              content_index=0, delta=piece, logprobs=[])

    def _thought(self, piece: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if self._open is None or self._open["type"] != "reasoning":
            yield from self._close("completed")
            self._open = reasoning_item(self.rid, "", "in_progress")
            yield self._event("response.output_item.added", output_index=len(self.items), item=self._open)
        self._open["content"][0]["text"] += piece
        yield self._event("response.reasoning_text.delta", item_id=self._open["id"], output_index=len(self.items),
                          content_index=0, delta=piece)

    def _call(self, delta: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        if "id" in delta:  # a new call begins
            yield from self._close("completed")
            self._open = function_call_item(delta["id"], delta["function"]["name"], "", "in_progress")
            yield self._event("response.output_item.added", output_index=len(self.items), item=self._open)
        arguments = delta["function"].get("arguments") or ""
        if arguments and self._open is not None:
            self._open["arguments"] += arguments
            yield self._event("response.function_call_arguments.delta", item_id=self._open["id"],
                              output_index=len(self.items), delta=arguments)

    def _close(self, status: str) -> Iterator[tuple[str, dict[str, Any]]]:
        item, self._open = self._open, None
        if item is None:
            return
        index = len(self.items)
        if item["type"] == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            yield self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                              text=self.text, logprobs=[])
            yield self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                              part=part)
            item = {**item, "content": [part]}
            self.text = ""
        elif item["type"] == "reasoning":
            yield self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                              content_index=0, text=item["content"][0]["text"])
        else:
            yield self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              name=item["name"], arguments=item["arguments"])
        item = {**item, "status": status}
        self.items.append(item)
        yield self._event("response.output_item.done", output_index=index, item=item)

    def _event(self, event_type: str, **payload: Any) -> tuple[str, dict[str, Any]]:
        self.sequence += 1
        return event_type, {"type": event_type, "sequence_number": self.sequence - 1, **payload}
