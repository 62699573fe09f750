"""Build a GenerateRequest from keyword arguments, setting only what the caller gave.

Optional proto fields have explicit presence: ``temperature=0`` (greedy) is sent as present, while
``temperature=None`` leaves it unset so the server default applies.

Constraints (``json_schema``, ``regex``, ``choice``, ``grammar``, ``schema_ref``) share one proto ``oneof``:
setting a second one would silently replace the first, so passing more than one is a ValueError here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from proctor_client.v1 import generation_pb2

MessageLike = tuple[str, str] | Mapping[str, str] | generation_pb2.ChatMessage
PluginLike = str | tuple[str, Mapping[str, Any] | None]
# The spellings this client accepts are the proto enums' value names, lower-cased: the proto is the one list
# both sides read (the server derives its tables from the same enums). The Literal aliases spell them again
# for type checkers only; a test keeps each equal to its enum.
GrammarSyntaxName = Literal["lark", "ebnf"]
ConstraintBackendName = Literal["auto", "xgrammar", "llguidance", "outlines"]
JsonWhitespaceName = Literal["compact", "flexible"]
EarlyStoppingName = Literal["heuristic", "when_full", "never"]
ContextOverflowName = Literal["refuse", "drop_oldest_turns", "keep_start_and_end"]
SpeculationName = Literal["on", "off"]


def wire_names(enum: Any, prefix: str) -> tuple[str, ...]:
    """A proto enum's value names after ``prefix``, lower-cased, without ``UNSPECIFIED`` (its number 0)."""
    return tuple(name.removeprefix(prefix).lower() for name, number in enum.items() if number != 0)


GRAMMAR_SYNTAXES = wire_names(generation_pb2.GrammarSyntax, "GRAMMAR_SYNTAX_")
CONSTRAINT_BACKENDS = wire_names(generation_pb2.ConstraintBackend, "CONSTRAINT_BACKEND_")
JSON_WHITESPACES = wire_names(generation_pb2.JsonWhitespace, "JSON_WHITESPACE_")
EARLY_STOPPINGS = wire_names(generation_pb2.BeamEarlyStopping, "BEAM_EARLY_STOPPING_")
CONTEXT_OVERFLOWS = wire_names(generation_pb2.ContextOverflow, "CONTEXT_OVERFLOW_")
SPECULATIONS = wire_names(generation_pb2.Speculation, "SPECULATION_")


def build_request(
    prompt: str | None = None,
    messages: Sequence[MessageLike] | None = None,
    *,
    request_id: str = "",
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    no_repeat_ngram_size: int | None = None,
    seed: int | None = None,
    typical_p: float | None = None,
    greedy_first_tokens: int | None = None,
    first_tokens_temperature: float | None = None,
    forced_tokens: Mapping[int, int] | None = None,
    max_new_tokens: int | None = None,
    min_new_tokens: int | None = None,
    stop: Sequence[str] | str = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    top_logprobs: int | None = None,
    token_details: bool = False,
    json_schema: str | Mapping[str, Any] | None = None,
    regex: str | None = None,
    choice: Sequence[str] | None = None,
    grammar: str | None = None,
    grammar_syntax: GrammarSyntaxName | None = None,
    schema_ref: str | None = None,
    constraint_backend: ConstraintBackendName | None = None,
    json_whitespace: JsonWhitespaceName | None = None,
    exact_only: bool = False,
    forbidden: Sequence[str] | str = (),
    forbidden_case_insensitive: bool | None = None,
    forbidden_whole_word: bool | None = None,
    logit_bias: Mapping[int, float] | None = None,
    allowed_token_ids: Sequence[int] = (),
    logits_processors: Sequence[PluginLike] = (),
    stopping_criteria: Sequence[PluginLike] = (),
    input_screens: Sequence[PluginLike] = (),
    output_moderators: Sequence[PluginLike] = (),
    repetition: tuple[int, int] | None = None,
    must_include: Sequence[str] | str = (),
    close_at_budget: bool | None = None,
    confidence: bool = False,
    context_overflow: ContextOverflowName | None = None,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    early_stopping: EarlyStoppingName | None = None,
    num_return_sequences: int | None = None,
    speculation: SpeculationName | None = None,
    cache_prompt: bool | None = None,
    subject_id: str = "",
    reasoning: bool | None = None,
    reasoning_max_tokens: int | None = None,
    reasoning_exclude: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> generation_pb2.GenerateRequest:
    """Return a request with exactly one of ``prompt`` (raw text) or ``messages`` (chat turns).

    At most one constraint: ``json_schema`` (JSON text, or a mapping serialized with json.dumps), ``regex``,
    ``choice`` (the output is one of these strings), ``grammar`` (its ``grammar_syntax`` defaults to lark) or
    ``schema_ref`` (a schema registered on the server, ``"name@version"`` or ``"name"`` for the latest).
    ``constraint_backend`` picks the engine (unset: the server's AUTO); ``json_whitespace`` applies to JSON
    constraints only; ``exact_only`` refuses a JSON schema no engine enforces exactly instead of serving it
    through the server's validated fallback.

    Generation controls: ``typical_p`` (locally typical sampling), ``greedy_first_tokens`` (the first N tokens
    greedy, then sampling), ``forced_tokens`` ({generated position: token id}), ``must_include`` (phrases the
    output must contain before it may end; a bare string is one phrase), ``close_at_budget`` (False: a JSON output
    that runs out of tokens is cut off instead of ended with its shortest valid ending; unset: on) and
    ``confidence`` (ask for the response's ``Confidence`` summary). See docs/generation-controls.md.

    A thinking model (README: reasoning models): ``reasoning`` False answers without a thought (None: the chat
    template decides), ``reasoning_max_tokens`` bounds the thought, ``reasoning_exclude`` leaves it out of the
    response (``reasoning_text``); ``chat_template_kwargs`` are extra variables for the model's chat template.

    Screens and moderators (docs/plugins.md): ``input_screens`` run on the input before generation (a block
    answers with the screen's reply, FINISH_REASON_BLOCKED); ``output_moderators`` run on the finished output
    (a block replaces it with the moderator's reply, FINISH_REASON_MODERATED; a stream is then held back).

    Raises ValueError when both or neither input is given, a message is malformed, more than one constraint
    is given, or an option does not fit its constraint; range checks and compiling are left to the server,
    which names the offending field.
    """
    if (prompt is None) == (messages is None):
        raise ValueError("pass exactly one of prompt or messages")
    request = generation_pb2.GenerateRequest(request_id=request_id, token_details=token_details)
    if prompt is not None:
        request.prompt = prompt
    else:
        assert messages is not None
        if isinstance(messages, str | bytes) or not messages:
            raise ValueError("messages must be a non-empty sequence of (role, content) pairs or mappings")
        request.messages.messages.extend(_chat_message(m, i) for i, m in enumerate(messages))

    sampling = {
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "min_p": min_p,
        "repetition_penalty": repetition_penalty,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
        "no_repeat_ngram_size": no_repeat_ngram_size,
        "seed": seed,
        "typical_p": typical_p,
        "greedy_first_tokens": greedy_first_tokens,
        "first_tokens_temperature": first_tokens_temperature,
        "num_beams": num_beams,
        "length_penalty": length_penalty,
    }
    for name, value in sampling.items():
        if value is not None:
            setattr(request.sampling, name, value)
    for position, token_id in (forced_tokens or {}).items():
        request.sampling.forced_tokens[int(position)] = int(token_id)

    if max_new_tokens is not None:
        request.stopping.max_new_tokens = max_new_tokens
    if min_new_tokens is not None:
        request.stopping.min_new_tokens = min_new_tokens
    # A bare string is one stop string, not a sequence of one-character stops.
    request.stopping.stop.extend([stop] if isinstance(stop, str) else stop)
    request.stopping.stop_token_ids.extend(stop_token_ids)
    if ignore_eos:
        request.stopping.ignore_eos = True
    if repetition is not None:
        request.stopping.repetition.ngram_size, request.stopping.repetition.repeats = repetition
    # A bare string is one phrase, not a list of one-character phrases.
    request.stopping.must_include.extend([must_include] if isinstance(must_include, str) else must_include)
    if close_at_budget is not None:
        request.stopping.close_at_budget = close_at_budget
    request.confidence = confidence
    if early_stopping is not None:
        if early_stopping not in EARLY_STOPPINGS:
            raise ValueError(f"early_stopping must be one of {', '.join(EARLY_STOPPINGS)}, got {early_stopping!r}")
        request.sampling.early_stopping = generation_pb2.BeamEarlyStopping.Value(
            f"BEAM_EARLY_STOPPING_{early_stopping.upper()}")
    if num_return_sequences is not None:
        request.num_return_sequences = num_return_sequences
    if context_overflow is not None:
        if context_overflow not in CONTEXT_OVERFLOWS:
            raise ValueError(f"context_overflow must be one of {', '.join(CONTEXT_OVERFLOWS)}, "
                             f"got {context_overflow!r}")
        request.context_overflow = generation_pb2.ContextOverflow.Value(f"CONTEXT_OVERFLOW_{context_overflow.upper()}")
    if speculation is not None:
        if speculation not in SPECULATIONS:
            raise ValueError(f"speculation must be one of {', '.join(SPECULATIONS)}, got {speculation!r}")
        request.speculation = generation_pb2.Speculation.Value(f"SPECULATION_{speculation.upper()}")
    if cache_prompt is not None:
        request.cache_prompt = cache_prompt
    if subject_id:
        request.subject_id = subject_id
    _set_reasoning(request, reasoning, reasoning_max_tokens, reasoning_exclude, chat_template_kwargs)
    if top_logprobs is not None:
        request.top_logprobs = top_logprobs
    _set_masks(request, forbidden, forbidden_case_insensitive, forbidden_whole_word, logit_bias, allowed_token_ids)
    request.logits_processors.extend(_plugin_call(call) for call in logits_processors)
    request.stopping_criteria.extend(_plugin_call(call) for call in stopping_criteria)
    request.input_screens.extend(_plugin_call(call) for call in input_screens)
    request.output_moderators.extend(_plugin_call(call) for call in output_moderators)
    _set_constraint(
        request,
        json_schema=json_schema,
        regex=regex,
        choice=choice,
        grammar=grammar,
        grammar_syntax=grammar_syntax,
        schema_ref=schema_ref,
        constraint_backend=constraint_backend,
        json_whitespace=json_whitespace,
        exact_only=exact_only,
    )
    return request


def _set_masks(request: generation_pb2.GenerateRequest, forbidden: Sequence[str] | str, case_insensitive: bool | None,
               whole_word: bool | None, logit_bias: Mapping[int, float] | None, allowed: Sequence[int]) -> None:
    # A bare string is one phrase, not a list of one-character phrases.
    request.forbidden.phrases.extend([forbidden] if isinstance(forbidden, str) else forbidden)
    if case_insensitive is not None:
        request.forbidden.case_insensitive = case_insensitive
    if whole_word is not None:
        request.forbidden.whole_word = whole_word
    for token_id, bias in (logit_bias or {}).items():
        request.logit_bias[int(token_id)] = float(bias)
    request.allowed_token_ids.extend(allowed)


def _plugin_call(call: PluginLike) -> generation_pb2.PluginCall:
    name, params = (call, None) if isinstance(call, str) else call
    message = generation_pb2.PluginCall(name=_string("plugin name", name))
    if params:
        message.params.update(_plain_mapping(params))
    return message


def _set_constraint(
    request: generation_pb2.GenerateRequest,
    *,
    json_schema: str | Mapping[str, Any] | None,
    regex: str | None,
    choice: Sequence[str] | None,
    grammar: str | None,
    grammar_syntax: str | None,
    schema_ref: str | None,
    constraint_backend: str | None,
    json_whitespace: str | None,
    exact_only: bool = False,
) -> None:
    """Fill the ``constraint`` oneof and its options; ValueError for combinations the server could only guess at."""
    given = {
        "json_schema": json_schema,
        "regex": regex,
        "choice": choice,
        "grammar": grammar,
        "schema_ref": schema_ref,
    }
    chosen = [name for name, value in given.items() if value is not None]
    if len(chosen) > 1:
        raise ValueError(f"pass at most one constraint, got {', '.join(chosen)}")
    kind = chosen[0] if chosen else None
    if grammar_syntax is not None and kind != "grammar":
        raise ValueError("grammar_syntax applies to grammar only")
    if json_whitespace is not None and kind not in ("json_schema", "schema_ref"):
        raise ValueError("json_whitespace applies to json_schema and schema_ref only")
    if constraint_backend is not None and kind is None:
        raise ValueError("constraint_backend needs a constraint")
    if exact_only and kind not in ("json_schema", "schema_ref"):
        raise ValueError("exact_only applies to json_schema and schema_ref only")
    request.constraint_exact_only = exact_only

    if json_schema is not None:
        request.json_schema = json_schema if isinstance(json_schema, str) else _schema_text(json_schema)
    elif regex is not None:
        request.regex = _string("regex", regex)
    elif choice is not None:
        request.choice.options.extend(_options(choice))
    elif grammar is not None:
        syntax = _enum_value(generation_pb2.GrammarSyntax, "GRAMMAR_SYNTAX_", "grammar_syntax",
                             grammar_syntax or "lark", GRAMMAR_SYNTAXES)
        request.grammar.CopyFrom(generation_pb2.GrammarConstraint(syntax=syntax, text=_string("grammar", grammar)))
    elif schema_ref is not None:
        request.schema_ref = _string("schema_ref", schema_ref)

    if constraint_backend is not None:
        request.constraint_backend = _enum_value(generation_pb2.ConstraintBackend, "CONSTRAINT_BACKEND_",
                                                 "constraint_backend", constraint_backend, CONSTRAINT_BACKENDS)
    if json_whitespace is not None:
        request.json_whitespace = _enum_value(generation_pb2.JsonWhitespace, "JSON_WHITESPACE_", "json_whitespace",
                                              json_whitespace, JSON_WHITESPACES)


def _schema_text(schema: Mapping[str, Any]) -> str:
    """A schema mapping as JSON text (nested mappings of any type included)."""
    if not isinstance(schema, Mapping):
        raise ValueError(f"json_schema must be JSON text or a mapping, got {type(schema).__name__}")
    try:
        return json.dumps(dict(schema), ensure_ascii=False, default=_plain_mapping)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"json_schema is not JSON-serializable: {exc}") from None


def _plain_mapping(value: object) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _string(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {type(value).__name__}")
    return value


def _options(choice: Sequence[str]) -> list[str]:
    # A bare string is a sequence too; as a choice it would mean "one of its characters", never what was meant.
    if isinstance(choice, str | bytes):
        raise ValueError("choice must be a sequence of strings, not a single string")
    options = list(choice)
    if not options:
        raise ValueError("choice needs at least one option")
    if not all(isinstance(option, str) for option in options):
        raise ValueError("choice options must be strings")
    return options


def _enum_value(enum: Any, prefix: str, name: str, value: str, allowed: tuple[str, ...]) -> int:
    """``"xgrammar"`` -> CONSTRAINT_BACKEND_XGRAMMAR; ValueError naming the allowed spellings otherwise."""
    if not isinstance(value, str) or value.lower() not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return int(enum.Value(prefix + value.upper()))


def _chat_message(message: MessageLike, index: int) -> generation_pb2.ChatMessage:
    """Convert one (role, content) pair, {"role", "content"} mapping or ChatMessage."""
    if isinstance(message, generation_pb2.ChatMessage):
        return message
    if isinstance(message, Mapping):
        try:
            role, content = message["role"], message["content"]
        except KeyError as missing:
            raise ValueError(f"messages[{index}] lacks the key {missing}") from None
    elif isinstance(message, tuple) and len(message) == 2:
        role, content = message
    else:
        raise ValueError(f"messages[{index}] must be a (role, content) pair or a mapping, got {type(message).__name__}")
    if not isinstance(role, str) or not isinstance(content, str):
        raise ValueError(f"messages[{index}]: role and content must be strings")
    return generation_pb2.ChatMessage(role=role, content=content)


def _set_reasoning(request: generation_pb2.GenerateRequest, enabled: bool | None, max_tokens: int | None,
                   exclude: bool, template_kwargs: Mapping[str, Any] | None) -> None:
    """A thinking model's section: on or off (None: the chat template decides), the thought's budget, whether the
    response leaves it out; and the chat template's extra variables."""
    if enabled is not None:
        request.reasoning.enabled = enabled
    if max_tokens is not None:
        request.reasoning.max_tokens = max_tokens
    if exclude:
        request.reasoning.exclude = True
    if template_kwargs:
        request.chat_template_kwargs_json = json.dumps(dict(template_kwargs), sort_keys=True)
