"""Building a request record (``proctor.audit.FORMAT``) from one call; and the request back from it.

No torch and no protobuf here: the API layer hands over domain objects and plain dicts.
The layout is documented in docs/audit-format.md; change it only with a new format version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proctor.audit import FORMAT
from proctor.audit.quoting import scrub_input_quotes, scrub_output_quotes, scrub_status
from proctor.domain import (
    ChatMessage,
    ConstraintRequest,
    ForbiddenParams,
    GenerationRequest,
    ModerationVerdict,
    PluginCall,
    RepetitionParams,
    SamplingParams,
    StoppingParams,
    TokenDetail,
    TokenEvent,
)
from proctor.domain.reasoning import ReasoningParams
from proctor.domain.request import valid_subject


@dataclass(frozen=True, slots=True)
class PrivacyPolicy:
    """``full`` keeps the text; ``hmac`` keeps only HMAC-SHA256 under a key held outside the store."""

    prompt: str = "full"
    output: str = "full"
    key: bytes | None = None

    def __post_init__(self) -> None:
        for name in ("prompt", "output"):
            if getattr(self, name) not in ("full", "hmac"):
                raise ValueError(f"audit {name} policy must be 'full' or 'hmac', got {getattr(self, name)!r}")
        if "hmac" in (self.prompt, self.output) and not self.key:
            raise ValueError("an 'hmac' audit policy needs a key (--audit-hmac-key-file)")

    def digest(self, text: str) -> str:
        assert self.key is not None
        return hmac.new(self.key, text.encode("utf-8"), hashlib.sha256).hexdigest()


@dataclass(slots=True)
class CallRecord:
    """Everything the API knows about one call, gathered as it runs."""

    audit_id: str
    method: str
    received_ms: int
    caller: dict[str, str]
    model: dict[str, Any]
    request: GenerationRequest | None = None
    raw_request: dict[str, Any] | None = None  # the message as received, when it did not convert
    rendered_prompt: str | None = None
    prompt_tokens: int = 0
    events: list[TokenEvent] = field(default_factory=list)
    status_code: str = "OK"
    status_message: str = ""
    replay_of: str = ""
    submitted: bool = False
    trace_id: str = ""  # W3C trace id (32 hex) of the call's trace, or of the caller's traceparent
    contract: dict[str, Any] | None = None  # a contract draft's attempt: template, clauses, check (Contracts)
    sample: dict[str, Any] | None = None  # one of n sampled completions: its group (request id) and index
    # Input screens and output moderators (decoding/plugins/moderation.py): the instances still to run on the
    # output, and what was decided. ``events`` keep the model's own output; ``moderation_reply`` is what the
    # caller got instead (blocked input or withheld output), ``output_withheld`` whether the output was withheld.
    moderators: tuple[Any, ...] = ()
    moderation: tuple[ModerationVerdict, ...] = ()
    moderation_reply: str | None = None
    output_withheld: bool = False
    receipt: str = ""  # the log's signed receipt, once the record is committed (api/audit_trail.py)


def request_to_dict(request: GenerationRequest, seed: int | None) -> dict[str, Any]:
    """Every generation parameter, with the seed actually used (replay rebuilds the request from it)."""
    data = dataclasses.asdict(request)
    data.pop("deadline", None)
    if data["constraint"] is not None:
        data["constraint"].pop("parsed", None)  # its text is the record's; the object is the door's parse of it
    for key in ("input_screens", "output_moderators", "tools_json", "chat_template_kwargs"):  # only when used: older
        if not data[key]:                                                                   # records keep their shape
            del data[key]
    if not request.reasoning.asked:
        del data["reasoning"]
    data["sampling"]["seed"] = None if seed is None else str(seed)  # 64-bit: beyond JSON's safe integers
    return data


def subject_of(request: GenerationRequest | None, caller: dict[str, str],
               raw_request: dict[str, Any] | None = None) -> str:
    """Whose data a call holds (its records are sealed under, and erased with, this subject's keys): the request's
    ``subject_id`` (a refused call's: the one its raw message names), else the caller. The one rule: the server
    fills ``subject_id`` with it when it admits a call (api/call_runner.admit), and a record derived from another
    (a replay) takes the other's."""
    if request is not None and request.subject_id:
        return request.subject_id
    named = (raw_request or {}).get("subjectId") if request is None else None
    return named if isinstance(named, str) and named and valid_subject(named) else str(caller.get("identity", ""))


def recorded_subject(body: dict[str, Any]) -> str:
    """The subject of a (opened) request record: its request's ``subject_id``, else, for records made before the
    server filled it in, its caller."""
    request = body.get("request") or {}
    return str(request.get("subject_id") or (body.get("caller") or {}).get("identity", ""))


def request_from_dict(data: dict[str, Any], request_id: str) -> GenerationRequest:
    stopping = dict(data["stopping"])
    stopping.setdefault("close_at_budget", False)  # recorded before it existed: generated without it
    if stopping.get("repetition"):
        stopping["repetition"] = RepetitionParams(**stopping["repetition"])
    for key in ("stop", "stop_token_ids"):
        stopping[key] = tuple(stopping[key])
    constraint = data.get("constraint")
    return GenerationRequest(
        request_id=request_id,
        prompt=data.get("prompt"),
        messages=tuple(ChatMessage(**m) for m in data["messages"]) if data.get("messages") is not None else None,
        tools_json=data.get("tools_json", ""),
        sampling=SamplingParams(**{**data["sampling"], "seed": None if data["sampling"]["seed"] is None
                                   else int(data["sampling"]["seed"])}),
        stopping=StoppingParams(**stopping),
        top_logprobs=data.get("top_logprobs", 0),
        token_details=data.get("token_details", False),
        constraint=ConstraintRequest(**{**constraint, "options": tuple(constraint["options"])}) if constraint else None,
        forbidden=ForbiddenParams(**{**data["forbidden"], "phrases": tuple(data["forbidden"]["phrases"])}),
        logit_bias=tuple((int(i), float(b)) for i, b in data.get("logit_bias", ())),
        allowed_token_ids=tuple(data.get("allowed_token_ids", ())),
        logits_processors=tuple(PluginCall(**p) for p in data.get("logits_processors", ())),
        stopping_criteria=tuple(PluginCall(**p) for p in data.get("stopping_criteria", ())),
        audit_top_n=data.get("audit_top_n", 0),
        audited=data.get("audited", False),
        confidence=data.get("confidence", False),
        context_overflow=data.get("context_overflow", "refuse"),
        num_return_sequences=data.get("num_return_sequences", 1),
        input_screens=tuple(PluginCall(**p) for p in data.get("input_screens", ())),
        output_moderators=tuple(PluginCall(**p) for p in data.get("output_moderators", ())),
        subject_id=str(data.get("subject_id") or ""),
        reasoning=ReasoningParams(**data["reasoning"]) if data.get("reasoning") else ReasoningParams(),
        chat_template_kwargs=str(data.get("chat_template_kwargs") or ""),
    )


def _tokens(events: list[TokenEvent], policy: PrivacyPolicy) -> list[dict[str, Any]]:
    return _token_entries((d for e in events for d in e.details), policy)


def _token_entries(details: Iterable[TokenDetail], policy: PrivacyPolicy) -> list[dict[str, Any]]:
    tokens: list[dict[str, Any]] = []
    hashed = policy.output == "hmac"
    for detail in details:
        entry: dict[str, Any] = {"step": len(tokens), "logprob": detail.logprob, "final_logprob": detail.final_logprob,
                                 "allowed": detail.allowed_count if detail.allowed_count >= 0 else None,
                                 "removed_by": detail.removed_by}
        if hashed:
            entry["id_hmac"] = policy.digest(str(detail.token_id))
            entry["top"] = [{"logprob": a.logprob} for a in detail.top_logprobs]
        else:
            entry["id"] = detail.token_id
            entry["text"] = detail.text
            entry["top"] = [{"id": a.token_id, "text": a.text, "logprob": a.logprob} for a in detail.top_logprobs]
        tokens.append(entry)
    return tokens


def _contract(contract: dict[str, Any], policy: PrivacyPolicy) -> dict[str, Any]:
    """A draft attempt's contract facts; the check's messages quote the output, so they follow its policy."""
    if policy.output == "full":
        return contract
    check = {k: v for k, v in contract.get("check", {}).items() if k != "errors"}
    return {**contract, "check": check}


def _moderation(call: CallRecord, policy: PrivacyPolicy) -> dict[str, Any]:
    """Every screen and moderator that ran; what the caller got instead of the model's output, if anything.

    ``output`` and ``tokens`` stay the model's own (so replay compares like with like): when
    ``output_withheld`` is true, that output was suppressed and the caller got ``reply``."""
    reply = call.moderation_reply
    return {
        "verdicts": [dataclasses.asdict(v) for v in call.moderation],
        "blocked_input": any(v.kind == "input_screen" and v.verdict == "block" for v in call.moderation),
        "output_withheld": call.output_withheld,
        "reply": None if reply is None else ({"policy": "full", "text": reply} if policy.output == "full"
                                             else {"policy": "hmac", "hmac_sha256": policy.digest(reply)}),
    }


def build_body(call: CallRecord, finished_ms: int, policy: PrivacyPolicy) -> dict[str, Any]:
    final = call.events[-1] if call.events and call.events[-1].finished else None
    output = "".join(e.text for e in call.events)
    body: dict[str, Any] = {
        "format": FORMAT, "kind": "request", "audit_id": call.audit_id, "method": call.method,
        "request_id": call.request.request_id if call.request else str((call.raw_request or {}).get("requestId", "")),
        "received_ms": call.received_ms, "finished_ms": finished_ms, "caller": call.caller, "model": call.model,
        "status": {"code": call.status_code, "message": call.status_message},
        "request": request_to_dict(call.request, final.seed if final else call.request.sampling.seed)
        if call.request else None,
        "raw_request": call.raw_request if call.request is None else None,
        "prompt": None, "output": None, "finish": None, "usage": None, "timings": None,
        "schema_validation": None, "constraint": None, "plugins": [], "replay_of": call.replay_of or None,
        "trace_id": call.trace_id or None,
        "tokens": _tokens(call.events, policy),
    }
    if call.contract is not None:  # only on Contracts calls: older records keep their exact shape
        body["contract"] = _contract(call.contract, policy)
    if call.sample is not None:
        body["sample"] = call.sample
    if call.moderation:  # only when a screen or moderator ran: older records keep their exact shape
        body["moderation"] = _moderation(call, policy)
    if policy.prompt == "hmac":  # the input must not leak through the parameters either
        for part in (body["request"], body["raw_request"]):
            if part:
                part.update({key: None for key in ("prompt", "messages", "tools_json") if key in part})
    if call.rendered_prompt is not None:
        body["prompt"] = ({"policy": "full", "text": call.rendered_prompt} if policy.prompt == "full"
                          else {"policy": "hmac", "hmac_sha256": policy.digest(call.rendered_prompt)})
        body["prompt"]["tokens"] = call.prompt_tokens
    if call.events:
        body["output"] = ({"policy": "full", "text": output} if policy.output == "full"
                          else {"policy": "hmac", "hmac_sha256": policy.digest(output)})
    if final is not None and final.usage is not None and final.usage.reasoning_tokens:
        # A thinking model's thought: the first usage.reasoning_tokens of the tokens, its text apart (markers left
        # out), under the output's policy (only when there was one: other records keep their shape).
        thought = "".join(e.reasoning for e in call.events)
        body["reasoning"] = ({"policy": "full", "text": thought, "tokens": final.usage.reasoning_tokens}
                             if policy.output == "full" else
                             {"policy": "hmac", "hmac_sha256": policy.digest(thought),
                              "tokens": final.usage.reasoning_tokens})
    if final is not None:
        assert final.finish_reason is not None
        body["finish"] = {"reason": final.finish_reason.value, "detail": final.finish_detail}
        if final.usage is not None:
            body["usage"] = dataclasses.asdict(final.usage)
            if not final.usage.reasoning_tokens:  # only a thinking model's: other records keep their shape
                del body["usage"]["reasoning_tokens"]
        if final.timings is not None:
            body["timings"] = dataclasses.asdict(final.timings)
        if final.schema_check is not None:
            body["schema_validation"] = {"valid": final.schema_check.valid, "errors": list(final.schema_check.errors),
                                         "sites": [{"path": path, "keyword": keyword}
                                                   for path, keyword in final.schema_check.sites]}
        if final.constraint is not None:
            body["constraint"] = dataclasses.asdict(final.constraint)
            if not final.constraint.remembered:  # issue 56's list only where it says something: older shapes kept
                body["constraint"].pop("remembered")
        body["plugins"] = [dataclasses.asdict(p) for p in final.plugins]
        if final.confidence is not None:  # only when asked for: older records keep their exact shape
            body["confidence"] = dataclasses.asdict(final.confidence)
        if final.sequences:  # beam search: every returned beam (the first is the output above)
            body["sequences"] = [{"score": s.score, "finish_reason": s.finish_reason.value,
                                  **({"token_ids": list(s.token_ids), "text": s.text} if policy.output == "full"
                                     else {"hmac_sha256": policy.digest(s.text)}),
                                  "tokens": _token_entries(s.details, policy)} for s in final.sequences]
        if final.prompt_truncation is not None:  # only when the input was shortened
            body["prompt_truncation"] = dataclasses.asdict(final.prompt_truncation)
        if final.must_include:
            body["must_include"] = [dataclasses.asdict(p) for p in final.must_include]
        if final.attempts:  # the validated fallback: every attempt, the returned one last
            body["attempts"] = [{**dataclasses.asdict(a), "finish_reason": a.finish_reason.value}
                                for a in final.attempts]
    _scrub(body, policy)
    return body


def _scrub(body: dict[str, Any], policy: PrivacyPolicy) -> None:
    """Under an ``hmac`` policy, the fields that quote what it keeps out (audit/quoting.py)."""
    if policy.output == "hmac":
        scrub_output_quotes(body, policy.digest)
    if policy.prompt == "hmac":
        scrub_input_quotes(body, policy.digest)
    if "hmac" in (policy.prompt, policy.output):
        scrub_status(body, policy.digest)


def finish_reason_of(body: dict[str, Any]) -> str:
    finish = body.get("finish")
    return finish["reason"] if finish else ""
