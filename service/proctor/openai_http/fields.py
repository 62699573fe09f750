"""The one table from an OpenAI-style body to ``GenerateRequest``: every field, standard or ours.

Each field of ``GenerateRequest``, ``SamplingParams`` and ``StoppingParams`` is either set by a standard
OpenAI body key (``STANDARD``, converted in openai_http/body.py) or offered as one of our extensions
(``EXTENSIONS``): a body key beside the standard ones, which the SDKs send as ``extra_body``. An extension
takes the field's proto3 JSON form (``google.protobuf.json_format``), with enums also by their short name
(``"speculation": "on"``). tests/unit/test_openai_fields.py fails when a proto field is in neither table, so
a new field on the proto side cannot be forgotten here.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor

from proctor.openai_http.errors import BodyError
from proctor_client.v1 import generation_pb2 as pb

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
VLLM_BACKENDS: dict[str, Any] = {  # the ConstraintBackend values
    "auto": pb.CONSTRAINT_BACKEND_AUTO, "xgrammar": pb.CONSTRAINT_BACKEND_XGRAMMAR,
    "guidance": pb.CONSTRAINT_BACKEND_LLGUIDANCE, "outlines": pb.CONSTRAINT_BACKEND_OUTLINES}
# The body keys vLLM's extensions take (each a 400 naming it when its value is wrong).
VLLM_KEYS = frozenset({"structured_outputs", *(k.partition(".")[0] for k in (*VLLM_CONSTRAINTS, *VLLM_OPTIONS))})
# How a violation's proto path reads when the table alone does not say (repeated messages' inner list).
PATH_ALIASES = {"messages.messages": "messages"}


def proto_leaves() -> list[str]:
    """Every field the tables must cover: GenerateRequest's, with sampling's and stopping's by path."""
    nested = {"sampling": pb.SamplingParams.DESCRIPTOR, "stopping": pb.StoppingParams.DESCRIPTOR}
    leaves = []
    for field in pb.GenerateRequest.DESCRIPTOR.fields:
        inner = nested.get(field.name)
        leaves.extend([f"{field.name}.{f.name}" for f in inner.fields] if inner is not None else [field.name])
    return leaves


def param_of(path: str, overrides: dict[str, str] | None = None) -> str:
    """The body key a violation's proto ``path`` (``stopping.stop[2]``) was set by (``stop[2]``)."""
    table = {**{p: k for k, p in EXTENSIONS.items()}, **STANDARD, **PATH_ALIASES, **(overrides or {})}
    for cut in sorted(table, key=len, reverse=True):
        if path == cut or path.startswith((f"{cut}.", f"{cut}[")):
            return table[cut] + path[len(cut):]
    return path


def _field(path: str) -> FieldDescriptor:
    descriptor = pb.GenerateRequest.DESCRIPTOR
    *parents, name = path.split(".")
    for parent in parents:
        descriptor = descriptor.fields_by_name[parent].message_type
    return descriptor.fields_by_name[name]


def _shortened(field: FieldDescriptor, value: Any) -> Any:
    """``value`` with every enum in it (a list's, a message's fields') given by its full name."""
    if isinstance(value, list):
        return [_shortened(field, v) for v in value]
    if field.enum_type is not None:
        return _enum_value(field.enum_type, value)
    if field.message_type is not None and isinstance(value, dict):
        inner = field.message_type.fields_by_name
        return {k: _shortened(inner[k], v) if k in inner else v for k, v in value.items()}
    return value


def _enum_value(enum: EnumDescriptor, value: Any) -> Any:
    """An enum given by its short name (``"on"``) as its full one (``SPECULATION_ON``); other values as given."""
    if not isinstance(value, str):
        return value
    unspecified = next((v.name for v in enum.values if v.name.endswith("_UNSPECIFIED")), "")
    prefix = unspecified.removesuffix("UNSPECIFIED")
    full = value.upper() if value.upper().startswith(prefix) else prefix + value.upper()
    return full if full in enum.values_by_name else value


def apply_extensions(body: dict[str, Any], message: pb.GenerateRequest) -> None:
    """Set every extension key of ``body`` on ``message``; a value the field cannot take is a BodyError naming it."""
    for key, path in EXTENSIONS.items():
        if key not in body or body[key] is None:
            continue
        value = _shortened(_field(path), body[key])
        *parents, name = path.split(".")
        wrapped: dict[str, Any] = {name: value}
        for parent in reversed(parents):
            wrapped = {parent: wrapped}
        try:
            message.MergeFrom(json_format.ParseDict(wrapped, pb.GenerateRequest()))
        except (json_format.ParseError, ValueError, TypeError, AttributeError) as exc:
            raise BodyError(f"{key}: not a valid value of this field ({_short(exc)})", key) from exc


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."
