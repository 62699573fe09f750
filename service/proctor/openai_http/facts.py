"""A call's own facts over HTTP: the final event as the gRPC door's response reports it, in its proto3 JSON form.

Beside OpenAI's fields every answer carries ``proctor``: what the gRPC door's ``GenerateResponse`` (or final
``GenerateChunk``) says beyond the text and tokens (audit id, finish reason and detail, seed, usage, timings, schema
validation, constraint, attempts, plugins, confidence, beams or samples, truncation, must-include, moderation,
receipt), written here from the domain's final event as ``google.protobuf.json_format`` would write that message
(field names as the proto spells them, defaults left out, enums by name, 64-bit integers as strings, a ``float``
as its shortest decimal): nothing the gRPC door reports is lost over HTTP, and nothing is spelt differently
(tests/unit/test_openai_wire.py holds it to the message).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from proctor.api.answered import asked_details
from proctor.domain import FinishReason, GenerationRequest, TokenDetail, TokenEvent
from proctor.domain.request import ContextOverflow
from proctor.openai_http.json_form import double_json, float32_json

FINISH_NAMES = {reason: f"FINISH_REASON_{reason.name}" for reason in FinishReason}
FORMAT_NAMES = {name: f"FORMAT_HANDLING_{name.upper()}" for name in ("enforced", "validated", "annotation")}
DECISION_NAMES = {"allow": "MODERATION_DECISION_ALLOW", "block": "MODERATION_DECISION_BLOCK"}
OVERFLOW_NAMES = {m.value: f"CONTEXT_OVERFLOW_{m.name}" for m in ContextOverflow}


def _set(**fields: Any) -> dict[str, Any]:
    """The fields a message writes: those not at their default (None: unset)."""
    return {name: value for name, value in fields.items() if value not in (None, 0, "", False, [], ())}


def final_facts(event: TokenEvent, request: GenerationRequest | None, audit_id: str) -> dict[str, Any]:
    """The final event's facts, as the response's fields after its text and tokens, in their order."""
    assert event.finish_reason is not None
    usage = timings = None
    if event.usage is not None:
        u = event.usage
        usage = _set(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                     cached_prompt_tokens=u.cached_prompt_tokens, decode_steps=u.decode_steps,
                     drafted_tokens=u.drafted_tokens, accepted_tokens=u.accepted_tokens,
                     closing_tokens=u.closing_tokens, reasoning_tokens=u.reasoning_tokens)
    if event.timings is not None:
        t = event.timings
        timings = _set(queue_ms=double_json(t.queue_ms), time_to_first_token_ms=double_json(t.time_to_first_token_ms),
                       total_ms=double_json(t.total_ms))
    facts = {"finish_reason": FINISH_NAMES[event.finish_reason], "usage": usage, "timings": timings,
             **_set(seed=str(event.seed) if event.seed else None, audit_id=audit_id,
                    finish_detail=event.finish_detail)}
    if event.schema_check is not None:
        facts["schema_validation"] = _set(valid=event.schema_check.valid, errors=list(event.schema_check.errors))
    facts |= _constraint(event)
    facts |= _set(plugins=[_set(name=p.name, version=p.version, kind=p.kind) for p in event.plugins],
                  attempts=[_set(attempt=a.number, seed=str(a.seed) if a.seed else None,
                                 temperature=float32_json(a.temperature) or None,
                                 completion_tokens=a.completion_tokens, finish_reason=FINISH_NAMES[a.finish_reason],
                                 valid=a.valid, errors=list(a.errors)) for a in event.attempts])
    if event.confidence is not None:
        c = event.confidence
        facts["confidence"] = _set(tokens=c.tokens, mean_token_probability=double_json(c.mean_token_probability),
                                   min_token_probability=double_json(c.min_token_probability),
                                   mean_top2_gap=double_json(c.mean_top2_gap),
                                   min_top2_gap=double_json(c.min_top2_gap))
    facts |= _set(must_include=[_set(phrase=p.phrase, included=p.included) for p in event.must_include])
    if event.prompt_truncation is not None:
        cut = event.prompt_truncation
        facts["prompt_truncation"] = _set(
            policy=OVERFLOW_NAMES[cut.policy], original_prompt_tokens=cut.original_prompt_tokens,
            prompt_tokens=cut.prompt_tokens, dropped_messages=cut.dropped_messages, dropped_tokens=cut.dropped_tokens)
    facts |= _set(moderation=[{**_set(name=v.name, version=v.version, kind=v.kind, decision=DECISION_NAMES[v.verdict]),
                               **({} if v.score is None else {"score": double_json(v.score)}),
                               **_set(reason=v.reason)} for v in event.moderation],
                  sequences=[_set(token_ids=list(s.token_ids), text=s.text, score=float32_json(s.score) or None,
                                  finish_reason=FINISH_NAMES[s.finish_reason], audit_id=s.audit_id or audit_id,
                                  tokens=token_details(s.details, request) if request is not None else None,
                                  receipt=s.receipt) for s in event.sequences],
                  receipt=event.receipt)
    return {name: value for name, value in facts.items() if value is not None}


def _constraint(event: TokenEvent) -> dict[str, Any]:
    c = event.constraint
    if c is None:
        return {}
    return {"constraint": _set(
        kind=c.kind, backend=c.backend, spec_sha256=c.spec_sha256, schema_ref=c.schema_ref, cache_hit=c.cache_hit,
        compile_ms=double_json(c.compile_ms), exact=c.exact, relaxed_keywords=list(c.relaxed),
        remembered_keywords=list(c.remembered),
        formats=[_set(path=f.path, format=f.format, handling=FORMAT_NAMES[f.handling]) for f in c.formats])}


def token_details(details: Iterable[TokenDetail], request: GenerationRequest | None) -> list[dict[str, Any]]:
    """The details the caller asked for (api/answered.py), as the response's ``tokens`` write them."""
    return [_set(token_id=d.token_id, text=d.text, logprob=float32_json(d.logprob) or None,
                 final_logprob=float32_json(d.final_logprob) or None,
                 top_logprobs=[_set(token_id=a.token_id, text=a.text, logprob=float32_json(a.logprob) or None)
                               for a in d.top_logprobs],
                 removed_by=d.removed_by) for d in asked_details(details, request)]
