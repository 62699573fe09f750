"""The call layer's answer (api/answered.py: the domain's events) in OpenAI's shapes.

Beside the standard fields every answer carries ``proctor``: the call's own facts, as the gRPC door's response
reports them (openai_http/facts.py: audit id, finish reason and detail, seed, schema validation, constraint,
attempts, usage details, ...), so nothing the gRPC door reports is lost over HTTP. Log-probabilities are given
as the gRPC door gives them, 32-bit floats.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from proctor.api.answered import Answer, Released, asked_details
from proctor.domain import FinishReason, TokenDetail, TokenEvent
from proctor.openai_http.body import CHAT, ParsedCall
from proctor.openai_http.facts import final_facts
from proctor.openai_http.json_form import float32
from proctor.openai_http.tools import CallStream, parse_output

STOPPED = "stop"
# Our finish reasons as OpenAI's: the end of the output, its length, or a filter that ended or replaced it.
FINISH_REASONS: dict[FinishReason, str] = {
    FinishReason.LENGTH: "length",
    FinishReason.FORBIDDEN_PHRASE: "content_filter",
    FinishReason.BLOCKED: "content_filter",
    FinishReason.MODERATED: "content_filter",
}


def finish_reason(reason: FinishReason | None) -> str:
    return FINISH_REASONS.get(reason, STOPPED) if reason is not None else STOPPED


def usage(event: TokenEvent) -> dict[str, Any]:
    """OpenAI's usage from the final event's (zeros where it has none)."""
    u = event.usage
    prompt, completion, cached = (u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens) if u else (0, 0, 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens if u else 0}}


def with_reasoning(message: dict[str, Any], thought: str) -> dict[str, Any]:
    """``message`` (or a delta) with the thought under both names clients read: vLLM's and DeepSeek's
    ``reasoning_content`` and the newer ``reasoning``."""
    return {**message, "reasoning_content": thought, "reasoning": thought} if thought else message


def proctor_facts(released: Released, call: ParsedCall) -> dict[str, Any]:
    """The call's own facts (everything but the text and tokens), and how the door served a schema."""
    facts = final_facts(released.event, released.request, released.audit_id)
    if call.schema is not None:
        facts["schema"] = call.schema.facts()
    return facts


def choice_finish(reason: FinishReason | None, called: bool) -> str:
    """OpenAI's finish reason of a choice: ``tool_calls`` when it called and ended of itself."""
    ending = finish_reason(reason)
    return "tool_calls" if called and ending == STOPPED else ending


def chat_logprobs(tokens: Iterable[TokenDetail]) -> dict[str, Any]:
    return {"content": [{"token": t.text, "logprob": float32(t.logprob), "bytes": list(t.text.encode()),
                         "top_logprobs": [{"token": a.text, "logprob": float32(a.logprob),
                                           "bytes": list(a.text.encode())} for a in t.top_logprobs]}
                        for t in tokens]}


def completion_logprobs(tokens: Iterable[TokenDetail], offset: int = 0) -> dict[str, Any]:
    found: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t in tokens:
        found["tokens"].append(t.text)
        found["token_logprobs"].append(float32(t.logprob))
        found["top_logprobs"].append({a.text: float32(a.logprob) for a in t.top_logprobs})
        found["text_offset"].append(offset)
        offset += len(t.text)
    return found


def _choices(answer: Answer) -> list[tuple[str, FinishReason | None, list[TokenDetail]]]:
    """(text, finish reason, token details) per choice: n completions arrive as the final event's sequences."""
    final = answer.events[-1]
    if len(final.sequences) > 1:
        return [(s.text, s.finish_reason, asked_details(s.details, answer.request)) for s in final.sequences]
    return [("".join(e.text for e in answer.events), final.finish_reason,
             asked_details((d for e in answer.events for d in e.details), answer.request))]


def unary_answer(call: ParsedCall, answer: Answer, created: int, fingerprint: str) -> dict[str, Any]:
    """The whole answer of a unary chat or completions call."""
    choices = []
    for index, (text, reason, tokens) in enumerate(_choices(answer)):
        if call.kind == CHAT:
            content, calls = (parse_output(text, call.tools, cut=reason is FinishReason.LENGTH)
                              if call.tools is not None else (text, []))
            message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
            if answer.request is not None:
                message = with_reasoning(message, answer.request.reasoning.shown(
                    "".join(e.reasoning for e in answer.events)))
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
    final = answer.events[-1]
    return {"id": f"{prefix}-{final.request_id}", "object": kind, "created": created, "model": call.model,
            "system_fingerprint": fingerprint, "choices": choices, "usage": usage(final),
            "proctor": proctor_facts(Released(final, answer.request, answer.audit_id), call)}


@dataclass
class ChunkWriter:
    """Turns a stream's events into OpenAI's stream chunks (chat.completion.chunk or text_completion)."""

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
        event, request = released.event, released.request
        self.request_id = self.request_id or event.request_id
        if self.call.choices > 1:  # n completions arrive whole at the end, each a choice
            for index, sequence in enumerate(event.sequences if event.finished else ()):
                yield from self._deltas(index, sequence.text, asked_details(sequence.details, request))
                yield from self._end(index, sequence.finish_reason, released)
            return
        tokens = asked_details(event.details, request)
        thought = request.reasoning.shown(event.reasoning) if self.call.kind == CHAT and request is not None else ""
        if event.text or tokens or thought:
            yield from self._deltas(0, event.text, tokens, thought)
        if event.finished:
            yield from self._end(0, event.finish_reason, released)

    def usage_chunk(self, released: Released) -> dict[str, Any]:
        return {**self._frame([]), "usage": usage(released.event)}

    def _deltas(self, index: int, text: str, tokens: list[TokenDetail], thought: str = "") -> Iterator[dict[str, Any]]:
        if self.call.kind != CHAT:
            if text or tokens:
                yield self._frame([{"index": index, "text": text, "finish_reason": None,
                                    "logprobs": completion_logprobs(tokens) if self.call.logprobs else None}])
            return
        delta: dict[str, Any] = {}
        if index not in self._started:
            delta["role"] = "assistant"
            self._started.add(index)
        delta = with_reasoning(delta, thought)
        content, calls = self.calls.feed(text) if self.calls is not None else (text, [])
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        if delta or tokens:
            yield self._frame([{"index": index, "delta": delta, "finish_reason": None,
                                "logprobs": chat_logprobs(tokens) if self.call.logprobs and tokens else None}])

    def _end(self, index: int, reason: FinishReason | None, released: Released) -> Iterator[dict[str, Any]]:
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
        yield {**self._frame([body]), "proctor": proctor_facts(released, self.call)}

    def _frame(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        prefix, kind = ("chatcmpl", "chat.completion.chunk") if self.call.kind == CHAT else ("cmpl", "text_completion")
        frame = {"id": f"{prefix}-{self.request_id}", "object": kind, "created": self.created,
                 "model": self.call.model, "system_fingerprint": self.fingerprint, "choices": choices}
        if self.call.include_usage:
            frame["usage"] = None
        return frame
