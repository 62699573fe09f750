"""proto ⇄ domain conversion: the only module where protobuf request/response types meet domain types."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from proctor.api.answered import asked_details
from proctor.constraints.engines import AUTO, BACKEND_NAMES
from proctor.constraints.spec import GrammarSyntax
from proctor.domain import (
    ChatMessage,
    ConstraintRequest,
    FinishReason,
    ForbiddenParams,
    GenerationRequest,
    PluginCall,
    RepetitionParams,
    SamplingParams,
    StoppingParams,
    TokenDetail,
    TokenEvent,
)
from proctor.domain.reasoning import ReasoningParams
from proctor.domain.request import ContextOverflow, EarlyStopping, Speculation
from proctor_client.v1 import generation_pb2 as pb

FINISH_TO_PROTO: dict[FinishReason, pb.FinishReason] = {
    FinishReason.EOS: pb.FINISH_REASON_EOS,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.STOP_STRING: pb.FINISH_REASON_STOP_STRING,
    FinishReason.STOP_TOKEN: pb.FINISH_REASON_STOP_TOKEN,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
    FinishReason.DEADLINE: pb.FINISH_REASON_DEADLINE,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
    FinishReason.CONSTRAINT_COMPLETE: pb.FINISH_REASON_CONSTRAINT_COMPLETE,
    FinishReason.DEAD_END: pb.FINISH_REASON_DEAD_END,
    FinishReason.FORBIDDEN_PHRASE: pb.FINISH_REASON_FORBIDDEN_PHRASE,
    FinishReason.REPETITION: pb.FINISH_REASON_REPETITION,
    FinishReason.CLOSED_AT_BUDGET: pb.FINISH_REASON_CLOSED_AT_BUDGET,
    FinishReason.STOP_CRITERION: pb.FINISH_REASON_STOP_CRITERION,
    FinishReason.BLOCKED: pb.FINISH_REASON_BLOCKED,
    FinishReason.MODERATED: pb.FINISH_REASON_MODERATED,
}
DECISION_TO_PROTO = {"allow": pb.MODERATION_DECISION_ALLOW, "block": pb.MODERATION_DECISION_BLOCK}


def _from_proto(enum: EnumTypeWrapper, prefix: str, names: dict[str, str], unspecified: str) -> dict[int, str]:
    """Wire number → our name, for a closed set of names kept in one table (``names``: the wire's spelling
    after ``prefix`` → our value). A name the proto lacks fails here, at import, not on a request."""
    table = {enum.Value(f"{prefix}{wire}"): value for wire, value in names.items()}
    table[enum.Value(f"{prefix}UNSPECIFIED")] = unspecified
    return table


BACKEND_FROM_PROTO = _from_proto(pb.ConstraintBackend, "CONSTRAINT_BACKEND_",
                                 {name.upper(): name for name in (AUTO, *BACKEND_NAMES)}, AUTO)
FORMAT_TO_PROTO: dict[str, pb.FormatHandling] = {
    "enforced": pb.FORMAT_HANDLING_ENFORCED,
    "validated": pb.FORMAT_HANDLING_VALIDATED,
    "annotation": pb.FORMAT_HANDLING_ANNOTATION,
}
CONTEXT_OVERFLOW_FROM_PROTO = _from_proto(pb.ContextOverflow, "CONTEXT_OVERFLOW_",
                                          {m.name: m for m in ContextOverflow}, ContextOverflow.REFUSE)
CONTEXT_OVERFLOW_TO_PROTO: dict[str, str] = {m.value: f"CONTEXT_OVERFLOW_{m.name}" for m in ContextOverflow}
SPECULATION_FROM_PROTO = _from_proto(pb.Speculation, "SPECULATION_",
                                     {m.name: m for m in Speculation if m is not Speculation.DEFAULT},
                                     Speculation.DEFAULT)
EARLY_STOPPING_FROM_PROTO = _from_proto(pb.BeamEarlyStopping, "BEAM_EARLY_STOPPING_",
                                        {m.name: m for m in EarlyStopping}, EarlyStopping.HEURISTIC)
SYNTAX_FROM_PROTO: dict[int, str] = {pb.GrammarSyntax.Value(f"GRAMMAR_SYNTAX_{s.name}"): s.value for s in GrammarSyntax}


def constraint_from_proto(message: pb.GenerateRequest) -> ConstraintRequest | None:
    """The request's constraint, converted (its enum numbers were checked by check_request; the constraint
    service checks the rest)."""
    kind = message.WhichOneof("constraint")
    if kind is None:
        return None
    backend = BACKEND_FROM_PROTO[message.constraint_backend]
    flexible, exact_only = message.json_whitespace == pb.JSON_WHITESPACE_FLEXIBLE, message.constraint_exact_only
    if kind == "choice":
        return ConstraintRequest("choice", options=tuple(message.choice.options), backend=backend,
                                 flexible_whitespace=flexible, exact_only=exact_only)
    if kind == "grammar":  # an unset syntax was refused by check_request (grammar.syntax)
        return ConstraintRequest("grammar", text=message.grammar.text,
                                 grammar_syntax=SYNTAX_FROM_PROTO[message.grammar.syntax], backend=backend,
                                 flexible_whitespace=flexible, exact_only=exact_only)
    return ConstraintRequest(kind, text=getattr(message, kind), backend=backend, flexible_whitespace=flexible,
                             exact_only=exact_only)


def _plugins(calls: Iterable[pb.PluginCall], field: str) -> tuple[PluginCall, ...]:
    return tuple(PluginCall(c.name, MessageToDict(c.params) if c.HasField("params") else {}, f"{field}[{i}]")
                 for i, c in enumerate(calls))


def _forbidden(message: pb.GenerateRequest) -> ForbiddenParams:
    f = message.forbidden
    return ForbiddenParams(phrases=tuple(f.phrases), **_present(f, ("case_insensitive", "whole_word")))


# The proto3 ``optional`` fields of SamplingParams whose unset value is the domain's default (domain/request.py,
# the one home of each default): only those the caller set are passed on.
SAMPLING_OPTIONALS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                      "frequency_penalty", "no_repeat_ngram_size", "seed", "typical_p", "greedy_first_tokens",
                      "first_tokens_temperature", "num_beams", "length_penalty")


def _present(message: Message, names: tuple[str, ...]) -> dict[str, Any]:
    """The optional fields of ``names`` that the caller set; the others keep the domain's defaults."""
    return {name: getattr(message, name) for name in names if message.HasField(name)}


def request_from_proto(message: pb.GenerateRequest) -> GenerationRequest:
    """The message as a domain request, converted only: api/check_request.py checks it, before and after, and
    adds the server's parts (the request id when none is given, the deadline, the server's own screens)."""
    s, st = message.sampling, message.stopping
    messages = None
    prompt = None
    tools_json = ""
    if message.WhichOneof("input") == "messages":
        messages = tuple(ChatMessage(m.role, m.content) for m in message.messages.messages)
        tools_json = message.messages.tools_json
    else:
        prompt = message.prompt
    request = GenerationRequest(
        request_id=message.request_id,
        prompt=prompt,
        messages=messages,
        tools_json=tools_json,
        sampling=SamplingParams(
            **_present(s, SAMPLING_OPTIONALS),
            early_stopping=EARLY_STOPPING_FROM_PROTO[s.early_stopping],
            forced_tokens=tuple(s.forced_tokens.items()),
        ),
        stopping=StoppingParams(
            **_present(st, ("max_new_tokens", "min_new_tokens", "close_at_budget")),
            stop=tuple(st.stop),
            stop_token_ids=tuple(st.stop_token_ids),
            ignore_eos=st.ignore_eos,
            repetition=RepetitionParams(st.repetition.ngram_size, st.repetition.repeats)
            if st.HasField("repetition") else None,
            must_include=tuple(st.must_include),
        ),
        **_present(message, ("top_logprobs", "num_return_sequences")),
        token_details=message.token_details,
        constraint=constraint_from_proto(message),
        forbidden=_forbidden(message),
        logit_bias=tuple(sorted(message.logit_bias.items())),
        allowed_token_ids=tuple(message.allowed_token_ids),
        logits_processors=_plugins(message.logits_processors, "logits_processors"),
        stopping_criteria=_plugins(message.stopping_criteria, "stopping_criteria"),
        confidence=message.confidence,
        context_overflow=CONTEXT_OVERFLOW_FROM_PROTO[message.context_overflow],
        speculation=SPECULATION_FROM_PROTO[message.speculation],
        **_present(message, ("cache_prompt",)),
        subject_id=message.subject_id,
        reasoning=ReasoningParams(**_present(message.reasoning, ("enabled", "max_tokens")),
                                  exclude=message.reasoning.exclude),
        chat_template_kwargs=message.chat_template_kwargs_json,
        input_screens=_plugins(message.input_screens, "input_screens"),
        output_moderators=_plugins(message.output_moderators, "output_moderators"),
    )
    return request


def request_to_proto(request: GenerationRequest) -> pb.GenerateRequest:
    """A converted request (before the server's parts) as the message that asks for it: a refused HTTP call's
    record keeps its request in this one form, as a gRPC call's does (an optional field is set when it differs
    from the domain's default)."""
    s, st, c = request.sampling, request.stopping, request.constraint
    message = pb.GenerateRequest(
        request_id=request.request_id, token_details=request.token_details, logit_bias=dict(request.logit_bias),
        allowed_token_ids=request.allowed_token_ids, confidence=request.confidence, subject_id=request.subject_id,
        context_overflow=_number(CONTEXT_OVERFLOW_FROM_PROTO, request.context_overflow),
        speculation=_number(SPECULATION_FROM_PROTO, request.speculation),
        forbidden=pb.ForbiddenPhrases(phrases=request.forbidden.phrases, **_changed(request.forbidden, (
            "case_insensitive", "whole_word"))),
        sampling=pb.SamplingParams(**_changed(s, SAMPLING_OPTIONALS), forced_tokens=dict(s.forced_tokens),
                                   early_stopping=_number(EARLY_STOPPING_FROM_PROTO, s.early_stopping)),
        stopping=pb.StoppingParams(**_changed(st, ("max_new_tokens", "min_new_tokens", "close_at_budget")),
                                   stop=st.stop, stop_token_ids=st.stop_token_ids, ignore_eos=st.ignore_eos,
                                   must_include=st.must_include),
        reasoning=pb.Reasoning(**_changed(request.reasoning, ("enabled", "max_tokens", "exclude"))),
        chat_template_kwargs_json=request.chat_template_kwargs,
        **_changed(request, ("top_logprobs", "num_return_sequences", "cache_prompt")))
    if st.repetition is not None:
        message.stopping.repetition.ngram_size, message.stopping.repetition.repeats = (st.repetition.ngram_size,
                                                                                       st.repetition.repeats)
    if request.messages is not None:
        message.messages.messages.extend(pb.ChatMessage(role=m.role, content=m.content) for m in request.messages)
        message.messages.tools_json = request.tools_json
    else:
        message.prompt = request.prompt or ""
    for name in ("logits_processors", "stopping_criteria", "input_screens", "output_moderators"):
        for call in getattr(request, name):
            getattr(message, name).add(name=call.name).params.update(call.params)
    if c is not None:
        _constraint_to_proto(c, message)
    return message


def _constraint_to_proto(c: ConstraintRequest, message: pb.GenerateRequest) -> None:
    message.constraint_backend = _number(BACKEND_FROM_PROTO, c.backend)
    message.json_whitespace = pb.JSON_WHITESPACE_FLEXIBLE if c.flexible_whitespace else pb.JSON_WHITESPACE_UNSPECIFIED
    message.constraint_exact_only = c.exact_only
    if c.kind == "choice":
        message.choice.options.extend(c.options)
    elif c.kind == "grammar":
        message.grammar.text = c.text
        message.grammar.syntax = _number(SYNTAX_FROM_PROTO, c.grammar_syntax)
    else:
        setattr(message, c.kind, c.text)


def _number(table: dict[int, Any], value: object) -> Any:
    """The wire number of ``value`` in a from-proto table: 0 (unset) for the one unset means (Any: the stubs type
    each enum's numbers apart)."""
    return 0 if table.get(0) == value else next(number for number, ours in table.items() if ours == value)


def _changed(params: object, names: tuple[str, ...]) -> dict[str, Any]:
    """The fields of ``names`` whose value differs from their default in ``type(params)()``."""
    default = type(params)() if not isinstance(params, GenerationRequest) else GenerationRequest("")
    return {name: getattr(params, name) for name in names if getattr(params, name) != getattr(default, name)}


def details_to_proto(details: Iterable[TokenDetail], request: GenerationRequest | None = None) -> list[pb.TokenDetail]:
    """Per-token details as the caller asked for them (api/answered.py; the engine may compute more for the audit)."""
    return [
        pb.TokenDetail(
            token_id=d.token_id, text=d.text, logprob=d.logprob, final_logprob=d.final_logprob,
            removed_by=d.removed_by, top_logprobs=[pb.TokenLogprob(token_id=a.token_id, text=a.text, logprob=a.logprob)
                                                   for a in d.top_logprobs])
        for d in asked_details(details, request)
    ]


def _fill_final(target: pb.GenerateResponse | pb.GenerateChunk, event: TokenEvent, audit_id: str = "",
                request: GenerationRequest | None = None) -> None:
    assert event.finish_reason is not None
    target.finish_reason = FINISH_TO_PROTO[event.finish_reason]
    target.finish_detail = event.finish_detail
    target.seed = event.seed
    if event.usage is not None:
        target.usage.prompt_tokens = event.usage.prompt_tokens
        target.usage.completion_tokens = event.usage.completion_tokens
        target.usage.cached_prompt_tokens = event.usage.cached_prompt_tokens
        target.usage.decode_steps = event.usage.decode_steps
        target.usage.drafted_tokens = event.usage.drafted_tokens
        target.usage.accepted_tokens = event.usage.accepted_tokens
        target.usage.closing_tokens = event.usage.closing_tokens
        target.usage.reasoning_tokens = event.usage.reasoning_tokens
    if event.schema_check is not None:
        target.schema_validation.valid = event.schema_check.valid
        target.schema_validation.errors.extend(event.schema_check.errors)
    if event.constraint is not None:
        c = event.constraint
        target.constraint.CopyFrom(pb.ConstraintInfo(
            kind=c.kind, backend=c.backend, spec_sha256=c.spec_sha256, schema_ref=c.schema_ref,
            cache_hit=c.cache_hit, compile_ms=c.compile_ms, exact=c.exact, relaxed_keywords=c.relaxed,
            remembered_keywords=c.remembered,
            formats=[pb.FormatUse(path=f.path, format=f.format, handling=FORMAT_TO_PROTO[f.handling])
                     for f in c.formats]))
    target.attempts.extend(
        pb.GenerationAttempt(attempt=a.number, seed=a.seed, temperature=a.temperature,
                             completion_tokens=a.completion_tokens, finish_reason=FINISH_TO_PROTO[a.finish_reason],
                             valid=a.valid, errors=a.errors)
        for a in event.attempts)
    target.plugins.extend(pb.PluginInfo(name=p.name, version=p.version, kind=p.kind) for p in event.plugins)
    if event.confidence is not None:
        confidence = event.confidence
        target.confidence.CopyFrom(pb.Confidence(
            tokens=confidence.tokens, mean_token_probability=confidence.mean_token_probability,
            min_token_probability=confidence.min_token_probability, mean_top2_gap=confidence.mean_top2_gap,
            min_top2_gap=confidence.min_top2_gap))
    target.sequences.extend(
        pb.ReturnedSequence(token_ids=s.token_ids, text=s.text, score=s.score, audit_id=s.audit_id or audit_id,
                            finish_reason=FINISH_TO_PROTO[s.finish_reason], receipt=s.receipt,
                            tokens=details_to_proto(s.details, request) if request is not None else [])
        for s in event.sequences)
    if event.prompt_truncation is not None:
        t = event.prompt_truncation
        target.prompt_truncation.CopyFrom(pb.PromptTruncation(
            policy=CONTEXT_OVERFLOW_TO_PROTO[t.policy], original_prompt_tokens=t.original_prompt_tokens,
            prompt_tokens=t.prompt_tokens, dropped_messages=t.dropped_messages, dropped_tokens=t.dropped_tokens))
    target.must_include.extend(pb.PhraseInclusion(phrase=p.phrase, included=p.included) for p in event.must_include)
    target.moderation.extend(pb.ModerationVerdict(name=v.name, version=v.version, kind=v.kind,
                                                  decision=DECISION_TO_PROTO[v.verdict], score=v.score, reason=v.reason)
                             for v in event.moderation)
    target.receipt = event.receipt
    if event.timings is not None:
        target.timings.queue_ms = event.timings.queue_ms
        target.timings.time_to_first_token_ms = event.timings.time_to_first_token_ms
        target.timings.total_ms = event.timings.total_ms


def chunk_from_event(event: TokenEvent, request: GenerationRequest | None = None,
                     audit_id: str = "") -> pb.GenerateChunk:
    chunk = pb.GenerateChunk(request_id=event.request_id, token_ids=event.token_ids, text=event.text,
                             tokens=details_to_proto(event.details, request),
                             reasoning_text=request.reasoning.shown(event.reasoning) if request else event.reasoning)
    if event.finished:
        _fill_final(chunk, event, audit_id, request)
        chunk.audit_id = audit_id
    return chunk


def response_from_events(events: list[TokenEvent], request: GenerationRequest | None = None,
                         audit_id: str = "") -> pb.GenerateResponse:
    """Concatenate a finished request's events into the unary response (same text as the stream)."""
    final = events[-1]
    response = pb.GenerateResponse(
        request_id=final.request_id,
        text="".join(e.text for e in events),
        reasoning_text=_thought(events, request),
        token_ids=[t for e in events for t in e.token_ids],
        tokens=details_to_proto((d for e in events for d in e.details), request),
        audit_id=audit_id,
    )
    _fill_final(response, final, audit_id, request)
    return response



def _thought(events: list[TokenEvent], request: GenerationRequest | None) -> str:
    thought = "".join(e.reasoning for e in events)
    return request.reasoning.shown(thought) if request is not None else thought
