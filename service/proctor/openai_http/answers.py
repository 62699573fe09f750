"""The gRPC door's answer (``GenerateResponse``, ``GenerateChunk``) in OpenAI's shapes.

Beside the standard fields every answer carries ``proctor``: the response's own facts in the proto3 JSON form
(audit id, finish reason and detail, seed, schema validation, constraint, attempts, usage details, ...), so
nothing the gRPC door reports is lost over HTTP.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.json_format import MessageToDict

from proctor.api.convert import chunk_from_event, response_from_events
from proctor.api.generation_service import Answer, Released
from proctor.openai_http.body import CHAT, ParsedCall
from proctor.openai_http.tools import CallStream, parse_output
from proctor_client.v1 import generation_pb2 as pb

STOPPED = "stop"
# Our finish reasons as OpenAI's: the end of the output, its length, or a filter that ended or replaced it.
FINISH_REASONS: dict[int, str] = {
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_FORBIDDEN_PHRASE: "content_filter",
    pb.FINISH_REASON_BLOCKED: "content_filter",
    pb.FINISH_REASON_MODERATED: "content_filter",
}
OWN_FIELDS = ("text", "token_ids", "tokens", "request_id")  # in the standard fields already


def finish_reason(reason: int) -> str:
    return FINISH_REASONS.get(reason, STOPPED)


def usage(response: pb.GenerateResponse | pb.GenerateChunk) -> dict[str, Any]:
    u = response.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens}}


def proctor_facts(response: pb.GenerateResponse | pb.GenerateChunk, call: ParsedCall) -> dict[str, Any]:
    """The response's own facts (everything but the text and tokens), and how the door served a schema."""
    facts: dict[str, Any] = MessageToDict(response, preserving_proto_field_name=True)
    for name in OWN_FIELDS:
        facts.pop(name, None)
    if call.schema is not None:
        facts["schema"] = call.schema.facts()
    return facts


def choice_finish(reason: int, called: bool) -> str:
    """OpenAI's finish reason of a choice: ``tool_calls`` when it called and ended of itself."""
    ending = finish_reason(reason)
    return "tool_calls" if called and ending == STOPPED else ending


def chat_logprobs(tokens: Iterable[pb.TokenDetail]) -> dict[str, Any]:
    return {"content": [{"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode()),
                         "top_logprobs": [{"token": a.text, "logprob": a.logprob, "bytes": list(a.text.encode())}
                                          for a in t.top_logprobs]} for t in tokens]}


def completion_logprobs(tokens: Iterable[pb.TokenDetail], offset: int = 0) -> dict[str, Any]:
    found: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t in tokens:
        found["tokens"].append(t.text)
        found["token_logprobs"].append(t.logprob)
        found["top_logprobs"].append({a.text: a.logprob for a in t.top_logprobs})
        found["text_offset"].append(offset)
        offset += len(t.text)
    return found


def _choices(response: pb.GenerateResponse) -> list[tuple[str, int, list[pb.TokenDetail]]]:
    """(text, finish reason, token details) per choice: n completions arrive as the response's sequences."""
    if len(response.sequences) > 1:
        return [(s.text, s.finish_reason, list(s.tokens)) for s in response.sequences]
    return [(response.text, response.finish_reason, list(response.tokens))]


def unary_answer(call: ParsedCall, answered: Answer, created: int, fingerprint: str) -> dict[str, Any]:
    """The whole answer of a unary chat or completions call."""
    response = response_from_events(answered.events, answered.request, answered.audit_id)
    choices = []
    for index, (text, reason, tokens) in enumerate(_choices(response)):
        if call.kind == CHAT:
            content, calls = (parse_output(text, call.tools, cut=reason == pb.FINISH_REASON_LENGTH)
                              if call.tools is not None else (text, []))
            message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
            if calls:
                message["tool_calls"] = calls
            choices.append({"index": index, "message": message,
                            "logprobs": chat_logprobs(tokens) if call.logprobs else None,
                            "finish_reason": choice_finish(reason, bool(calls))})
        else:
            choices.append({"index": index, "text": text,
                            "logprobs": completion_logprobs(tokens) if call.logprobs else None,
                            "finish_reason": finish_reason(reason)})
    prefix, kind = ("chatcmpl", "chat.completion") if call.kind == CHAT else ("cmpl", "text_completion")
    return {"id": f"{prefix}-{response.request_id}", "object": kind, "created": created, "model": call.model,
            "system_fingerprint": fingerprint, "choices": choices, "usage": usage(response),
            "proctor": proctor_facts(response, call)}


@dataclass
class ChunkWriter:
    """Turns the gRPC door's chunks into OpenAI's stream chunks (chat.completion.chunk or text_completion)."""

    call: ParsedCall
    created: int
    fingerprint: str
    request_id: str = ""
    calls: CallStream | None = None
    _started: set[int] = field(default_factory=set, init=False)  # the choices whose role went out

    def __post_init__(self) -> None:
        if self.call.tools is not None:
            self.calls = CallStream(self.call.tools)

    def chunks(self, released: Released) -> Iterator[dict[str, Any]]:
        """The stream chunks one event releases (its final one carries the finish reason and our facts)."""
        chunk = chunk_from_event(released.event, released.request, released.audit_id)
        self.request_id = self.request_id or chunk.request_id
        final = chunk.finish_reason != pb.FINISH_REASON_UNSPECIFIED
        if self.call.message.num_return_sequences > 1:  # n completions arrive whole at the end, each a choice
            for index, sequence in enumerate(chunk.sequences if final else ()):
                yield from self._choice_chunks(index, sequence.text, list(sequence.tokens), sequence.finish_reason,
                                               chunk)
            return
        if chunk.text or chunk.tokens:
            yield from self._deltas(0, chunk.text, list(chunk.tokens))
        if final:
            yield from self._end(0, chunk.finish_reason, chunk)

    def usage_chunk(self, released: Released) -> dict[str, Any]:
        chunk = chunk_from_event(released.event, released.request, released.audit_id)
        return {**self._frame([]), "usage": usage(chunk)}

    def _choice_chunks(self, index: int, text: str, tokens: list[pb.TokenDetail], reason: int,
                       chunk: pb.GenerateChunk) -> Iterator[dict[str, Any]]:
        yield from self._deltas(index, text, tokens)
        yield from self._end(index, reason, chunk)

    def _deltas(self, index: int, text: str, tokens: list[pb.TokenDetail]) -> Iterator[dict[str, Any]]:
        if self.call.kind != CHAT:
            if text or tokens:
                yield self._frame([{"index": index, "text": text, "finish_reason": None,
                                    "logprobs": completion_logprobs(tokens) if self.call.logprobs else None}])
            return
        delta: dict[str, Any] = {}
        if index not in self._started:
            delta["role"] = "assistant"
            self._started.add(index)
        content, calls = self.calls.feed(text) if self.calls is not None else (text, [])
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        if delta or tokens:
            yield self._frame([{"index": index, "delta": delta, "finish_reason": None,
                                "logprobs": chat_logprobs(tokens) if self.call.logprobs and tokens else None}])

    def _end(self, index: int, reason: int, chunk: pb.GenerateChunk) -> Iterator[dict[str, Any]]:
        delta: dict[str, Any] = {}
        called = False
        if self.call.kind == CHAT and self.calls is not None:
            content, calls = self.calls.finish()
            if content:
                delta["content"] = content
            if calls:
                delta["tool_calls"] = calls
            called = self.calls.called
        body = {"index": index, "finish_reason": choice_finish(reason, called), "logprobs": None}
        body.update({"delta": delta} if self.call.kind == CHAT else {"text": delta.get("content", "")})
        yield {**self._frame([body]), "proctor": proctor_facts(chunk, self.call)}

    def _frame(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        prefix, kind = ("chatcmpl", "chat.completion.chunk") if self.call.kind == CHAT else ("cmpl", "text_completion")
        frame = {"id": f"{prefix}-{self.request_id}", "object": kind, "created": self.created,
                 "model": self.call.model, "system_fingerprint": self.fingerprint, "choices": choices}
        if self.call.include_usage:
            frame["usage"] = None
        return frame
