"""From a contract request to generation requests, and from an output to a verdict.

A draft runs as a sequence of ordinary, audited generation requests (attempts): each one is the
template's prompts rendered with the request's parts, constrained by the specialised schema
(``specialise.py``). An attempt whose output fails the check is repaired by the next one within the
budget, changed by what went wrong (``next_plan``): cut at the token limit → more tokens; stopped by
the repetition detector → a repetition penalty and sampling with a new seed; anything else → sampling
with a new seed. Each attempt is a complete record of its own in the audit trail (replayable alone),
and every record of a draft names the draft, the template version and the attempt.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import jsonschema

from proctor.constraints.json_schema import json_path
from proctor.contracts.request import ContractRequest, RequiredClause
from proctor.contracts.specialise import Specialised
from proctor.contracts.templates import ContractTemplate
from proctor.domain import (
    ChatMessage,
    ConstraintRequest,
    FinishReason,
    ForbiddenParams,
    GenerationRequest,
    RepetitionParams,
    SamplingParams,
    StoppingParams,
)
from proctor.domain.seeds import attempt_seed

RETRY_TEMPERATURE = 0.5  # a greedy draft's repair samples (a greedy retry would repeat itself)
LENGTH_GROWTH = 1.5  # a draft cut at its token limit is retried with this many times the tokens
REPETITION_PENALTY = 1.15  # a draft that looped is retried with this penalty (CTRL style, 1: none)
# An attempt ending for one of these ends the draft: the caller went away, time ran out, the engine failed.
FINAL_REASONS = frozenset({FinishReason.CANCELLED, FinishReason.DEADLINE, FinishReason.ERROR})


@dataclass(frozen=True)
class AttemptPlan:
    number: int
    seed: int
    temperature: float  # 0: greedy
    max_new_tokens: int
    repetition_penalty: float = 1.0
    reason: str = "first attempt"  # why this attempt runs as it does (reported and audited)


@dataclass(frozen=True)
class ClauseCheck:
    id: str
    title: str
    present: bool


@dataclass(frozen=True)
class ContractCheck:
    valid: bool  # parses, validates against the specialised schema, and holds every required clause
    errors: tuple[str, ...]
    clauses: tuple[ClauseCheck, ...]
    document: Any = None


def render_messages(template: ContractTemplate, request: ContractRequest,
                    specialised: Specialised) -> tuple[ChatMessage, ...]:
    """System prompt, the template's examples as earlier turns, then the request (chat-templated by the engine)."""
    prompts = template.prompts(request.language)
    assert prompts is not None  # the conversion checked the language
    fields = {
        "title": template.title,
        "parties": "\n".join(f"- {p.name} ({p.role}{', ' + p.jurisdiction if p.jurisdiction else ''})"
                             for p in request.parties),
        "facts": "\n".join(f"- {name}: {value}" for name, value in specialised.facts) or "-",
        "clauses": "\n".join(f"- {c.id} {c.title}".rstrip() for c in specialised.clauses) or "-",
    }
    messages = [ChatMessage("system", prompts.system.format(**fields))]
    for user, assistant in prompts.examples:
        messages += [ChatMessage("user", user), ChatMessage("assistant", assistant)]
    messages.append(ChatMessage("user", prompts.user.format(**fields)))
    return tuple(messages)


def first_plan(template: ContractTemplate, request: ContractRequest, seed: int, limit: int) -> AttemptPlan:
    tokens = min(request.max_new_tokens or template.max_new_tokens, limit)
    return AttemptPlan(1, seed, request.temperature or 0.0, tokens)


def next_plan(previous: AttemptPlan, finish: FinishReason, base_seed: int, limit: int) -> AttemptPlan:
    """The repair after ``previous`` ended with ``finish`` and failed the check."""
    number = previous.number + 1
    seed = attempt_seed(base_seed, number)
    temperature = previous.temperature or RETRY_TEMPERATURE
    if finish is FinishReason.LENGTH and previous.max_new_tokens < limit:
        tokens = min(limit, math.ceil(previous.max_new_tokens * LENGTH_GROWTH))
        return dataclasses.replace(previous, number=number, seed=seed, max_new_tokens=tokens,
                                   reason=f"attempt {previous.number} was cut at {previous.max_new_tokens} tokens")
    if finish is FinishReason.REPETITION:
        return dataclasses.replace(previous, number=number, seed=seed, temperature=temperature,
                                   repetition_penalty=max(previous.repetition_penalty, REPETITION_PENALTY),
                                   reason=f"attempt {previous.number} repeated itself")
    return dataclasses.replace(previous, number=number, seed=seed, temperature=temperature,
                               reason=f"attempt {previous.number} ended {finish.value} without a valid contract")


def generation_request(request: ContractRequest, template: ContractTemplate, specialised: Specialised,
                       plan: AttemptPlan,
                       messages: tuple[ChatMessage, ...], deadline: float | None) -> GenerationRequest:
    ngram, repeats = template.repetition
    return GenerationRequest(
        request_id=f"{request.request_id}#{plan.number}",
        messages=messages,
        sampling=SamplingParams(temperature=plan.temperature or None, seed=plan.seed,
                                repetition_penalty=plan.repetition_penalty),
        stopping=StoppingParams(max_new_tokens=plan.max_new_tokens, repetition=RepetitionParams(ngram, repeats)),
        constraint=ConstraintRequest("json_schema", text=specialised.schema_json),
        forbidden=ForbiddenParams(phrases=request.forbidden),
        deadline=deadline,
        subject_id=request.subject_id,
    )


def check_contract(text: str, template: ContractTemplate, specialised: Specialised) -> ContractCheck:
    """The server's own check of an output, whatever the mask promised: it parses, it validates against the
    specialised schema, and every required clause is there with its id and title."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        return ContractCheck(False, (f"not complete JSON: {exc}",), _clauses(None, template, specialised.clauses))
    validator = jsonschema.Draft202012Validator(specialised.schema)
    errors = tuple(f"at {json_path(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document))
    clauses = _clauses(document, template, specialised.clauses)
    missing = tuple(f"required clause {c.id} is missing" for c in clauses if not c.present)
    return ContractCheck(not errors and not missing, errors + missing, clauses, document)


def _clauses(document: Any, template: ContractTemplate,
             required: tuple[RequiredClause, ...]) -> tuple[ClauseCheck, ...]:
    found: list[Any] = []
    if isinstance(document, dict):
        node: Any = document
        for key in template.clauses.path.split("/")[1:]:
            if key == "properties":
                continue
            node = node.get(key) if isinstance(node, dict) else None
        found = node if isinstance(node, list) else []
    spec = template.clauses

    def present(clause: RequiredClause) -> bool:
        return any(isinstance(item, dict) and item.get(spec.id) == clause.id
                   and (not clause.title or item.get(spec.title) == clause.title) for item in found)

    return tuple(ClauseCheck(c.id, c.title, present(c)) for c in required)

