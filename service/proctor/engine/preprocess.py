"""Turning a validated request into prompt token ids and resolved limits (before admission).

Runs on the caller's side (a worker thread), not on the decode thread: chat templating and
tokenizing a long prompt must not stall other requests. Errors name the request field.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from proctor.domain import (
    FieldViolation,
    GenerationRequest,
    PluginCall,
    PluginInfo,
    PromptTruncation,
    RequestValidationError,
)
from proctor.domain.output_budget import OutputBudget, OutputLimits, output_budget
from proctor.domain.request import ContextOverflow
from proctor.engine.context_policy import input_room, shorten
from proctor.engine.template_kwargs import template_kwargs
from proctor.engine.thought import ThoughtPlan, plan_thought

if TYPE_CHECKING:
    from proctor.constraints.service import PreparedConstraint
    from proctor.decoding.forbidden import ForbiddenIndex
    from proctor.decoding.plugins import PluginContext, PluginRegistry
    from proctor.decoding.plugins.api import Kind
    from proctor.decoding.plugins.moderation import ModerationPlugin
    from proctor.engine.closing_facts import ClosingFacts
    from proctor.engine.thought_markers import ThoughtMarkers


@dataclass(frozen=True, slots=True)
class RequestControls:
    """Per-request masks, processors, stopping criteria and plugins (with the screens and moderators the API
    runs once per call), built off the decode thread (shared parts are cached)."""

    forbidden: ForbiddenIndex | None = None
    allowed_mask: torch.Tensor | None = None  # [V] bool, True = may be produced
    logit_bias: tuple[torch.Tensor, torch.Tensor] | None = None  # (ids, values)
    processors: tuple[tuple[str, Any], ...] = ()  # ("plugin:<name>", instance)
    criteria: tuple[tuple[str, Any], ...] = ()
    plugins: tuple[PluginInfo, ...] = ()
    # Run by the API, once per call, never per step (decoding/plugins/moderation.py).
    screens: tuple[ModerationPlugin, ...] = ()
    moderators: tuple[ModerationPlugin, ...] = ()


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    request: GenerationRequest
    prompt_ids: tuple[int, ...]
    output_budget: OutputBudget  # after the caller's limits and the context (domain/output_budget.py)
    constraint: PreparedConstraint | None = None
    controls: RequestControls = RequestControls()
    rendered_prompt: str = ""  # the input as the model saw it (chat template applied), for the audit
    truncation: PromptTruncation | None = None  # how context_overflow shortened the input, if it did
    closing: ClosingFacts | None = None  # a JSON output's closing within its budget (engine/closing.py)
    thought: ThoughtPlan | None = None  # a thinking model's section before the answer (engine/thought.py)


_LONGEST: dict[int, int] = {}


def longest_token_bytes(tokenizer: Any) -> int:
    """An upper bound of the bytes one token stands for: its piece's UTF-8 length (a byte-level piece
    spells each byte as one character of at most 2 UTF-8 bytes; a sentencepiece piece is the text)."""
    key = id(tokenizer)
    if key not in _LONGEST:
        _LONGEST[key] = max(8, max((len(piece.encode("utf-8")) for piece in tokenizer.get_vocab()), default=8))
    return _LONGEST[key]


SAMPLE_CHARS = 4096  # measured first: how many characters a token spells in this input
PREFIX_MARGIN = 1.25  # the prefix tried holds this many times the context at the sampled rate
PREFIX_SLACK_TOKENS = 64  # a cut can change the tokens at its edge; never refuse within this margin


def _prefix_too_long(tokenizer: Any, text: str, context_length: int) -> int:
    """A lower bound of the input's tokens when a prefix alone overflows the context, else 0.

    A long input whose whitespace runs make the bytes bound weak (one token can spell 80 spaces)
    would otherwise be tokenized whole to be refused: 900,000 characters take half a second. The
    characters per token of a sample size one prefix that should just overflow; only that is tokenized.
    """
    if len(text) <= context_length * 4:  # short enough to tokenize whole
        return 0
    sample = len(tokenizer(text[:SAMPLE_CHARS], add_special_tokens=False)["input_ids"]) or 1
    cut = int(context_length * SAMPLE_CHARS / sample * PREFIX_MARGIN) + SAMPLE_CHARS
    if cut >= len(text):
        return 0
    count = len(tokenizer(text[:cut], add_special_tokens=False)["input_ids"]) - PREFIX_SLACK_TOKENS
    return count if count >= context_length else 0


def render_prompt(tokenizer: Any, request: GenerationRequest) -> tuple[str, bool]:
    """Return (text, add_special_tokens). Chat messages go through the model's chat template."""
    if request.messages is None:
        return request.prompt or "", True
    if not getattr(tokenizer, "chat_template", None):
        raise RequestValidationError.single("messages", "this model has no chat template; send a plain prompt")
    turns = [{"role": m.role, "content": m.content} for m in request.messages]
    kwargs = template_kwargs(tokenizer, request)
    if not request.tools_json:
        return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, **kwargs), False
    tools = json.loads(request.tools_json)
    if "tools" in tokenizer.chat_template:  # the template shows the tools its own way
        return tokenizer.apply_chat_template(turns, tools=tools, tokenize=False, add_generation_prompt=True,
                                             **kwargs), False
    return tokenizer.apply_chat_template(with_tools_message(turns, tools), tokenize=False,
                                         add_generation_prompt=True, **kwargs), False


TOOLS_MESSAGE = """You can call these functions. To call one, reply with only
<tool_call>{{"name": <function name>, "arguments": <arguments object>}}</tool_call>
Functions (JSON):
{tools}"""


def with_tools_message(turns: list[dict[str, str]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The turns with the tools described in the system message (for a chat template that takes no tools);
    the call format is the one tool-calling templates (Hermes, Qwen) teach, and what the HTTP API parses."""
    described = TOOLS_MESSAGE.format(tools="\n".join(json.dumps(t.get("function", t), ensure_ascii=False)
                                                     for t in tools))
    if turns and turns[0]["role"] == "system":
        return [{"role": "system", "content": f"{turns[0]['content']}\n\n{described}"}, *turns[1:]]
    return [{"role": "system", "content": described}, *turns]


def prepare_request(tokenizer: Any, request: GenerationRequest, *, context_length: int,
                    limits: OutputLimits, markers: ThoughtMarkers | None = None) -> PreparedRequest:
    """The input's ids, the output budget (``limits``: the server's; a request from a door arrives with its
    ``max_new_tokens`` resolved under the caller's, and resolves to the same here) and, for a thinking model
    (``markers``), the request's section."""
    prepared = _prepare_input(tokenizer, request, context_length, limits)
    thought = plan_thought(markers, prepared.rendered_prompt, request.reasoning, request.messages is not None)
    if thought is None:
        return prepared
    if request.sampling.num_beams > 1:  # beams fork the constraint's matcher, which knows nothing of the section
        raise RequestValidationError.single(
            "sampling.num_beams", "beam search is not offered with a thinking model's section (its thought and the "
                                  "answer after it); sample instead, or ask for no thought (reasoning.enabled false) "
                                  "on a model whose template does not open one")
    prepared.output_budget.require(thought.overhead, f"the thought's markers, {thought.overhead} tokens")
    return dataclasses.replace(prepared, thought=thought)


def _prepare_input(tokenizer: Any, request: GenerationRequest, context_length: int,
                   limits: OutputLimits) -> PreparedRequest:
    budget = output_budget(request.stopping, limits)
    field = "messages" if request.messages is not None else "prompt"
    if request.context_overflow != ContextOverflow.REFUSE:  # an input that does not fit is shortened, not refused
        text, ids, truncation = shorten(tokenizer, request, lambda r: render_prompt(tokenizer, r),
                                        input_room(context_length, budget.max_new_tokens))
        return _limited(request, text, ids, budget, context_length, field, truncation)
    text, add_special = render_prompt(tokenizer, request)
    fewest = len(text.encode("utf-8")) // longest_token_bytes(tokenizer)  # no tokenization can use fewer
    if fewest >= context_length:  # refused before tokenizing it (a 900,000-character prompt took seconds)
        raise RequestValidationError.single(
            field, f"the input is at least {fewest} tokens; the model's context is {context_length} tokens")
    too_long = _prefix_too_long(tokenizer, text, context_length)
    if too_long:
        raise RequestValidationError.single(
            field, f"the input is at least {too_long} tokens; the model's context is {context_length} tokens")
    ids = tokenizer(text, add_special_tokens=add_special)["input_ids"]
    return _limited(request, text, ids, budget, context_length, field, None)


def _limited(request: GenerationRequest, text: str, ids: list[int], budget: OutputBudget, context_length: int,
             field: str, truncation: PromptTruncation | None) -> PreparedRequest:
    """The prepared request with its output budget capped by the room the context leaves."""
    if not ids:
        raise RequestValidationError.single(field, "the input encodes to zero tokens")
    if len(ids) >= context_length:
        raise RequestValidationError.single(
            field, f"the input is {len(ids)} tokens; the model's context is {context_length} tokens "
                   "and at least one must remain for output")
    budget = budget.within_context(context_length - len(ids), context_length)
    return PreparedRequest(request, tuple(ids), budget, rendered_prompt=text, truncation=truncation)


def prepare_controls(request: GenerationRequest, *, tokenizer: Any, vocab_size: int, server_forbidden: tuple[str, ...],
                  plugins: PluginRegistry, context: PluginContext) -> RequestControls:
    """Build the forbidden index and the plugin instances (the token ids were checked: api/check_request.py)."""
    from proctor.decoding.forbidden import ForbiddenOptions, build_index

    phrases = tuple(dict.fromkeys((*server_forbidden, *request.forbidden.phrases)))
    forbidden = None
    if phrases:
        options = ForbiddenOptions(request.forbidden.case_insensitive, request.forbidden.whole_word)
        forbidden = build_index(tokenizer, vocab_size, phrases, options)
    allowed = None
    if request.allowed_token_ids:
        allowed = torch.zeros(vocab_size, dtype=torch.bool)
        allowed[list(request.allowed_token_ids)] = True
    bias = None
    if request.logit_bias:
        bias = (torch.tensor([i for i, _ in request.logit_bias], dtype=torch.long),
                torch.tensor([b for _, b in request.logit_bias], dtype=torch.float32))
    processors: list[tuple[str, Any]] = []
    criteria: list[tuple[str, Any]] = []
    infos: list[PluginInfo] = []
    if request.logits_processors or request.stopping_criteria:
        lists: tuple[tuple[Kind, tuple[PluginCall, ...], list[tuple[str, Any]]], ...] = (
            ("logits_processor", request.logits_processors, processors),
            ("stopping_criterion", request.stopping_criteria, criteria))
        for kind, calls, out in lists:
            for spec, instance in plugins.instantiate(calls, kind, context):
                out.append((f"plugin:{spec.name}", instance))
                infos.append(PluginInfo(spec.name, spec.version, spec.kind))
    screens, moderators = _moderation_plugins(request, plugins, context, infos)
    return RequestControls(forbidden, allowed, bias, tuple(processors), tuple(criteria), tuple(infos),
                        screens, moderators)


def _moderation_plugins(request: GenerationRequest, plugins: PluginRegistry, context: PluginContext,
                        infos: list[PluginInfo]) -> tuple[tuple[ModerationPlugin, ...], tuple[ModerationPlugin, ...]]:
    """The request's input screens and output moderators, instantiated (bad names or params: INVALID_ARGUMENT)."""
    if not (request.input_screens or request.output_moderators):
        return (), ()
    from proctor.decoding.plugins.moderation import ModerationPlugin

    built: dict[str, list[ModerationPlugin]] = {"input_screen": [], "output_moderator": []}
    bad: list[FieldViolation] = []
    lists: tuple[tuple[Kind, tuple[PluginCall, ...]], ...] = (
        ("input_screen", request.input_screens), ("output_moderator", request.output_moderators))
    for kind, calls in lists:
        try:
            for spec, instance in plugins.instantiate(calls, kind, context):
                built[kind].append(ModerationPlugin(spec.name, spec.version, spec.kind, instance))
                infos.append(PluginInfo(spec.name, spec.version, spec.kind))
        except RequestValidationError as exc:  # both lists' violations are reported together
            bad += exc.violations
    if bad:
        raise RequestValidationError(bad)
    return tuple(built["input_screen"]), tuple(built["output_moderator"])
