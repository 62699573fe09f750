"""An OpenAI-style request body, checked and converted into the call layer's request (openai_http/draft.py).

Only the body's shape is checked here (types, the keys this server knows, one constraint at most); the ranges
and limits are checked by the call layer (api/check_request.py), the one place for them, whose violations are
then named by the body keys (openai_http/fields.py). A body error names its key in ``param``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from proctor.constraints.tool_calls import CALL_CLOSE, CALL_OPEN
from proctor.openai_http.draft import Draft
from proctor.openai_http.errors import BodyError
from proctor.openai_http.fields import CONSTRAINT_KEYS, EXTENSIONS, VLLM_KEYS, apply_extensions
from proctor.openai_http.json_form import INT32, float32
from proctor.openai_http.reasoning import KEYS as REASONING_KEYS
from proctor.openai_http.reasoning import read_reasoning
from proctor.openai_http.structured import Constraint, SchemaUse, response_format, vllm_constraint
from proctor.openai_http.tools import ToolPlan, tool_plan

CHAT, COMPLETION = "chat", "completion"
COMMON_KEYS = frozenset({"model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "presence_penalty",
                         "frequency_penalty", "logit_bias", "logprobs", "user", "stream", "stream_options",
                         "response_format"})
KEYS = {CHAT: COMMON_KEYS | REASONING_KEYS | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                                              "tool_choice", "parallel_tool_calls"},
        COMPLETION: COMMON_KEYS | {"prompt", "echo", "suffix", "best_of"}}
# Accepted and without effect here: storage and routing hints for OpenAI's own platform.
IGNORED_KEYS = frozenset({"store", "metadata", "service_tier"})
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "user"}
MAX_COMPLETION_LOGPROBS = 5  # the completions API's own limit on its ``logprobs`` count


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """What the HTTP door needs to run the call and to answer it in OpenAI's shapes."""

    kind: str
    draft: Draft
    model: str
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    tools: ToolPlan | None = None
    schema: SchemaUse | None = None  # a caller's JSON schema: strict or not, the objects closed
    user: str = ""
    params: dict[str, str] = field(default_factory=dict)  # proto path → body key, where the usual one differs
    responses_echo: dict[str, Any] | None = None  # a Responses API call: the fields its response repeats back

    @property
    def choices(self) -> int:
        """How many completions the call asks for (``n``)."""
        return int(self.draft.values.get("num_return_sequences", 1))


def parse_body(raw: object, kind: str) -> ParsedCall:
    """The checked and converted body of a ``kind`` (chat or completion) request; BodyError otherwise."""
    if not isinstance(raw, dict):
        raise BodyError("the request body must be a JSON object", "body")
    body: dict[str, Any] = raw
    known = KEYS[kind] | EXTENSIONS.keys() | IGNORED_KEYS | VLLM_KEYS
    for key in body:
        if key not in known:
            raise BodyError(f"Unrecognized request argument supplied: {key}", key)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BodyError("model is required: the id GET /v1/models lists", "model")
    draft = Draft()
    params: dict[str, str] = {}
    plan = None
    if kind == CHAT:
        plan = tool_plan(body)
        _messages(body.get("messages"), draft, plan)
        read_reasoning(body, draft, params)
    else:
        _prompt(body, draft)
    _sampling(body, draft)
    _stopping(body, draft, kind)
    logprobs = _logprobs(body, draft, kind)
    if body.get("logit_bias") is not None:
        _logit_bias(body["logit_bias"], draft)
    user = _optional(body, "user", str) or ""
    stream = bool(_optional(body, "stream", bool))
    include_usage = _stream_options(body, stream)
    constraint = _constraint(body, draft, plan)
    if constraint is not None and constraint.source not in CONSTRAINT_KEYS:  # named by the key that set it
        field = draft.constraint_kind() or "json_schema"
        params[field] = constraint.source
        if field == "grammar":  # a grammar's violations name its text
            params["grammar.text"] = constraint.source
    if plan is not None and draft.values.get("num_return_sequences", 0) > 1:
        raise BodyError("n > 1 with tools is not supported: one choice per tool-calling request", "n")
    apply_extensions(body, draft)
    schema = constraint.schema if constraint is not None else None
    return ParsedCall(kind, draft, model, stream, include_usage, logprobs, plan, schema, user, params)


def _constraint(body: dict[str, Any], draft: Draft, plan: ToolPlan | None) -> Constraint | None:
    """The one constraint the body sets (an extension key, vLLM's keys, response_format or tools), if any."""
    found = [c for c in (response_format(body.get("response_format"), draft, "response_format"),
                         vllm_constraint(body, draft)) if c is not None]
    found += [Constraint(key) for key in CONSTRAINT_KEYS if body.get(key) is not None]
    if plan is not None and plan.constrain(draft):
        found.append(Constraint("tools", SchemaUse(plan.strict, plan.closed())))
    if len(found) > 1:
        raise BodyError(f"{found[1].source} and {found[0].source} both constrain the output; send one",
                        found[1].source)
    return found[0] if found else None


def _optional(body: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
        names = {bool: "a boolean", int: "an integer", str: "a string", (int, float): "a number"}
        raise BodyError(f"{key} must be {names.get(kind, 'of another type')}", key)
    return value


def _int32(body: dict[str, Any], key: str) -> int | None:
    """An integer key whose field is a 32-bit integer (as the gRPC door's message holds it)."""
    value = _optional(body, key, int)
    if value is not None and not INT32[0] <= value < INT32[1]:
        raise BodyError(f"{key} must be between {INT32[0]} and {INT32[1] - 1}", key)
    return value  # type: ignore[no-any-return]


def _number(body: dict[str, Any], key: str) -> float | None:
    """A number key whose field is a 32-bit float (as the gRPC door's message holds it)."""
    value = _optional(body, key, (int, float))
    try:
        return None if value is None else float32(float(value))
    except OverflowError:
        raise BodyError(f"{key} must be a number a 32-bit float can hold", key) from None


def _text(content: object, where: str) -> str:
    """A message's content: a string, or text parts (the only kind a text model takes)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise BodyError(f"{where} must be a string or an array of text parts", where)
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise BodyError(f"{where}[{index}] must be {{\"type\": \"text\", \"text\": ...}}: this model reads text "
                            "only", f"{where}[{index}]")
        texts.append(part["text"])
    return "".join(texts)


def _messages(raw: object, draft: Draft, plan: ToolPlan | None) -> None:
    if not isinstance(raw, list) or not raw:
        raise BodyError("messages must be a non-empty array", "messages")
    turns: list[tuple[str, str]] = []
    for index, entry in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(entry, dict):
            raise BodyError(f"{where} must be an object", where)
        role = entry.get("role")
        if role not in ROLES:
            raise BodyError(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
        content = _text(entry.get("content"), f"{where}.content")
        if role == "tool":  # a tool's result, as tool-calling templates show it
            content = f"<tool_response>\n{content}\n</tool_response>"
        for call in entry.get("tool_calls") or () if role == "assistant" else ():
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                raise BodyError(f"{where}.tool_calls entries must hold a function", f"{where}.tool_calls")
            arguments = function.get("arguments", "{}")
            try:
                parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
            except ValueError as exc:
                raise BodyError(f"{where}.tool_calls: arguments are not JSON", f"{where}.tool_calls") from exc
            content += CALL_OPEN + json.dumps({"name": function.get("name"), "arguments": parsed}) + CALL_CLOSE
        turns.append((ROLES[role], content))
    draft.values["messages"] = turns
    if plan is not None:
        draft.values["tools_json"] = plan.definitions


def _prompt(body: dict[str, Any], draft: Draft) -> None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BodyError("prompt must be a string (one prompt per request)", "prompt")
    draft.values["prompt"] = prompt
    if body.get("echo"):
        raise BodyError("echo is not supported: the response holds the completion only", "echo")
    if body.get("suffix"):
        raise BodyError("suffix is not supported: this server completes after the prompt only", "suffix")
    best_of = _optional(body, "best_of", int)
    if best_of is not None and best_of != (body.get("n") or 1):
        raise BodyError("best_of other than n is not supported", "best_of")


def _sampling(body: dict[str, Any], draft: Draft) -> None:
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = _number(body, key)
        if value is not None:
            draft.values[f"sampling.{key}"] = value
    seed = _optional(body, "seed", int)
    if seed is not None:
        if not 0 <= seed < 2**64:
            raise BodyError("seed must be between 0 and 2**64 - 1", "seed")
        draft.values["sampling.seed"] = seed
    n = _int32(body, "n")
    if n is not None:
        draft.values["num_return_sequences"] = n


def _stopping(body: dict[str, Any], draft: Draft, kind: str) -> None:
    limit = _int32(body, "max_completion_tokens") if kind == CHAT else None
    if limit is None:
        limit = _int32(body, "max_tokens")
    if limit is not None:
        draft.values["stopping.max_new_tokens"] = limit
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BodyError("stop must be a string or an array of strings", "stop")
        draft.values["stopping.stop"] = stop


def _logprobs(body: dict[str, Any], draft: Draft, kind: str) -> bool:
    """Per-token log-probabilities: chat's ``logprobs`` + ``top_logprobs``, or the completions' count."""
    if kind == CHAT:
        wanted = bool(_optional(body, "logprobs", bool))
        top = _int32(body, "top_logprobs")
        if top is not None and not wanted:
            raise BodyError("top_logprobs needs logprobs: true", "top_logprobs")
    else:
        top = _optional(body, "logprobs", int)
        if top is not None and not 0 <= top <= MAX_COMPLETION_LOGPROBS:
            raise BodyError(f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}", "logprobs")
        wanted = top is not None
    if wanted:
        draft.values["token_details"] = True
        if top:
            draft.values["top_logprobs"] = top
    return wanted


def _logit_bias(raw: object, draft: Draft) -> None:
    if not isinstance(raw, dict):
        raise BodyError("logit_bias must map token ids to biases", "logit_bias")
    biases: dict[int, float] = draft.values.setdefault("logit_bias", {})
    for key, bias in raw.items():
        where = f"logit_bias[{key}]"
        try:
            token = int(key)
        except ValueError:
            raise BodyError(f"{where}: {key!r} is not a token id", where) from None
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -2**31 <= token < 2**31 \
                or abs(bias) > 2**1023:
            raise BodyError(f"{where} must be a number for a token id", where)
        biases[token] = float32(float(bias))


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise BodyError("stream_options is only allowed with stream: true", "stream_options")
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise BodyError("stream_options must be {\"include_usage\": true|false}", "stream_options")
    return bool(options.get("include_usage", False))
