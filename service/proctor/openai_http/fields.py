"""The one table from an OpenAI-style body to the request: every field of ``GenerateRequest``, standard or ours.

Each field of ``GenerateRequest``, ``SamplingParams`` and ``StoppingParams`` is either set by a standard
OpenAI body key (``STANDARD``, converted in openai_http/body.py) or offered as one of our extensions
(``EXTENSIONS``): a body key beside the standard ones, which the SDKs send as ``extra_body``. An extension
takes the field's proto3 JSON form (openai_http/json_form.py), with enums also by their short name
(``"speculation": "on"``). tests/unit/test_openai_http.py fails when a proto field is in neither table, so
a new field on the proto side cannot be forgotten here. The fields are named by their proto paths throughout
the door (openai_http/draft.py), so a violation the call layer finds is named back by the body key that set it.
"""

from __future__ import annotations

from typing import Any

from proctor.openai_http.draft import CONSTRAINT_FIELDS, Draft
from proctor.openai_http.errors import BodyError
from proctor.openai_http.json_form import ENUMS, KINDS, PRESENCE, FormError, read

# proto path → the standard OpenAI body key that sets it (openai_http/body.py converts these)
STANDARD: dict[str, str] = {
    "prompt": "prompt",
    "messages": "messages",
    "json_schema": "response_format.json_schema.schema",  # or tools (openai_http/tools.py)
    "top_logprobs": "top_logprobs",
    "token_details": "logprobs",
    "logit_bias": "logit_bias",
    "num_return_sequences": "n",
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.presence_penalty": "presence_penalty",
    "sampling.frequency_penalty": "frequency_penalty",
    "sampling.seed": "seed",
    "stopping.max_new_tokens": "max_tokens",  # or max_completion_tokens
    "stopping.stop": "stop",
    "reasoning": "reasoning",  # or reasoning_effort, thinking_token_budget (openai_http/reasoning.py)
    "chat_template_kwargs_json": "chat_template_kwargs",
}
# extension body key → proto path (the key is the field's own name)
EXTENSIONS: dict[str, str] = {name: path for path in (
    "request_id", "regex", "choice", "grammar", "schema_ref", "constraint_backend", "json_whitespace",
    "constraint_exact_only", "forbidden", "allowed_token_ids", "logits_processors", "stopping_criteria",
    "confidence", "context_overflow", "input_screens", "output_moderators", "speculation", "cache_prompt", "subject_id",
    "sampling.top_k", "sampling.min_p", "sampling.repetition_penalty", "sampling.no_repeat_ngram_size",
    "sampling.typical_p", "sampling.greedy_first_tokens", "sampling.forced_tokens", "sampling.num_beams",
    "sampling.length_penalty", "sampling.early_stopping", "sampling.first_tokens_temperature",
    "stopping.min_new_tokens", "stopping.stop_token_ids", "stopping.ignore_eos", "stopping.repetition",
    "stopping.must_include", "stopping.close_at_budget",
) for name in (path.rpartition(".")[2],)}
# The constraint fields: at most one of them, or of response_format, tools and vLLM's keys, per request.
CONSTRAINT_KEYS = ("regex", "choice", "grammar", "schema_ref")
# vLLM's spellings of a constraint (its structured_outputs object, and the older top-level guided_* keys) → the
# kind they set (openai_http/structured.py applies them), and its options → the field they set.
VLLM_CONSTRAINTS: dict[str, str] = {
    "guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
    "structured_outputs.json": "json", "structured_outputs.regex": "regex", "structured_outputs.choice": "choice",
    "structured_outputs.grammar": "grammar", "structured_outputs.json_object": "json_object",
}
VLLM_OPTIONS: dict[str, str] = {
    "structured_outputs.disable_fallback": "constraint_exact_only",
    "structured_outputs.disable_any_whitespace": "json_whitespace",
    "structured_outputs.disable_additional_properties": "",  # objects are closed here whatever it says
    "guided_decoding_backend": "constraint_backend",
}
VLLM_BACKENDS: dict[str, int] = {  # the ConstraintBackend values
    name: ENUMS["ConstraintBackend"].read(ours)
    for name, ours in (("auto", "auto"), ("xgrammar", "xgrammar"), ("guidance", "llguidance"),
                       ("outlines", "outlines"))}
# The body keys vLLM's extensions take (each a 400 naming it when its value is wrong).
VLLM_KEYS = frozenset({"structured_outputs", *(k.partition(".")[0] for k in (*VLLM_CONSTRAINTS, *VLLM_OPTIONS))})
# How a violation's proto path reads when the table alone does not say (repeated messages' inner list).
PATH_ALIASES = {"messages.messages": "messages"}


def param_of(path: str, overrides: dict[str, str] | None = None) -> str:
    """The body key a violation's proto ``path`` (``stopping.stop[2]``) was set by (``stop[2]``)."""
    table = {**{p: k for k, p in EXTENSIONS.items()}, **STANDARD, **PATH_ALIASES, **(overrides or {})}
    for cut in sorted(table, key=len, reverse=True):
        if path == cut or path.startswith((f"{cut}.", f"{cut}[")):
            return table[cut] + path[len(cut):]
    return path


def apply_extensions(body: dict[str, Any], draft: Draft) -> None:
    """Set every extension key of ``body`` on ``draft``; a value the field cannot take is a BodyError naming it.

    As merging the field's message would: a field without presence given at its default leaves what the body set
    otherwise (a strict ``response_format`` stays exact with ``constraint_exact_only: false``)."""
    for key, path in EXTENSIONS.items():
        if key not in body or body[key] is None:
            continue
        try:
            value = read(KINDS[path], body[key])
        except FormError as exc:
            raise BodyError(f"{key}: not a valid value of this field ({_short(exc)})", key) from exc
        if path in CONSTRAINT_FIELDS:
            draft.set_constraint(path, value)
        elif path in PRESENCE or value or not isinstance(value, bool | int | str):
            draft.values[path] = value


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."
