"""The constraint a body asks for, in every spelling the clients use, as the request's one constraint.

- ``response_format`` (chat) and ``text.format`` (Responses): ``json_schema`` is always enforced: served as
  gRPC's AUTO serves a schema (exact where an engine enforces it, else the validated fallback, said in
  ``proctor.constraint``), or a 400 naming the keyword. ``strict: true`` also refuses the fallback (exact or a
  400). Either way objects that list their properties are closed (constraints/json_schema/closing.py), as OpenAI's
  strict mode defines them and as vLLM, SGLang and llama-server serve every schema. ``json_object`` is any
  JSON object; ``text`` is no constraint.
- vLLM's extensions: ``structured_outputs`` ``{json|regex|choice|grammar|json_object}`` and the older
  ``guided_*`` keys (fields.py's ``VLLM_CONSTRAINTS`` is the table).

A JSON schema is set as the object the body held (objects closed), with its text for the limits and the record:
nothing parses it again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proctor.constraints.json_schema import close_objects
from proctor.openai_http.draft import Draft
from proctor.openai_http.errors import BodyError
from proctor.openai_http.fields import VLLM_BACKENDS, VLLM_CONSTRAINTS, VLLM_OPTIONS
from proctor.openai_http.json_form import ENUMS

ANY_OBJECT = {"type": "object"}  # json_object: any JSON object, as OpenAI's JSON mode gives
FORMAT_TYPES = ("text", "json_object", "json_schema")


@dataclass(frozen=True, slots=True)
class SchemaUse:
    """How the door served a caller's JSON schema: strict (exact or refused) and the objects it closed."""

    strict: bool
    closed: tuple[str, ...]

    def facts(self) -> dict[str, Any]:
        return {"strict": self.strict, "closed_objects": list(self.closed)}


@dataclass(frozen=True, slots=True)
class Constraint:
    """The constraint a body set: the key that set it (``param`` of its errors) and a schema's use."""

    source: str
    schema: SchemaUse | None = None


def set_json_schema(draft: Draft, schema: object, where: str, *, strict: bool) -> SchemaUse:
    """Constrain ``draft`` to ``schema`` (objects closed; ``strict``: no validated fallback)."""
    if isinstance(schema, str):  # vLLM and some clients send the schema as JSON text
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise BodyError(f"{where} is not valid JSON ({exc})", where) from None
    if not isinstance(schema, dict):
        raise BodyError(f"{where} must be a JSON schema object", where)
    closed = close_objects(schema)
    constrain_to_schema(draft, closed.schema)
    draft.values["constraint_exact_only"] = strict
    return SchemaUse(strict, closed.closed)


def constrain_to_schema(draft: Draft, schema: object) -> None:
    """The JSON schema constraint: the object itself, and its text (as the gRPC door's message would hold it)."""
    draft.set_constraint("json_schema", json.dumps(schema), (schema,))


def response_format(raw: object, draft: Draft, where: str, *, flat: bool = False) -> Constraint | None:
    """Chat's ``response_format`` (``flat``: the Responses API's ``text.format``, name and schema beside type)."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in FORMAT_TYPES or not isinstance(raw, dict):
        raise BodyError(f'{where}.type must be "text", "json_object" or "json_schema"', f"{where}.type")
    if kind == "text":
        return None
    if kind == "json_object":
        constrain_to_schema(draft, ANY_OBJECT)
        return Constraint(where)
    spec, at = (raw, where) if flat else (raw.get("json_schema"), f"{where}.json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise BodyError(f"{at} must hold a name and a schema", at)
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise BodyError(f"{at}.strict must be a boolean", f"{at}.strict")
    schema = spec.get("schema", {})
    return Constraint(f"{at}.schema", set_json_schema(draft, schema, f"{at}.schema", strict=bool(strict)))


def vllm_constraint(body: dict[str, Any], draft: Draft) -> Constraint | None:
    """vLLM's ``structured_outputs`` or ``guided_*`` keys on ``draft``; None when the body has none."""
    found: list[tuple[str, str, Any]] = []
    outputs = body.get("structured_outputs")
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise BodyError("structured_outputs must be an object", "structured_outputs")
        for key, value in outputs.items():
            path = f"structured_outputs.{key}"
            if path not in VLLM_CONSTRAINTS and path not in VLLM_OPTIONS:
                raise BodyError(f"{path} is not supported here (json, regex, choice, grammar, json_object, "
                                "disable_fallback, disable_any_whitespace, disable_additional_properties are)", path)
            if path in VLLM_CONSTRAINTS and value is not None and value is not False:
                found.append((path, VLLM_CONSTRAINTS[path], value))
    found += [(key, VLLM_CONSTRAINTS[key], body[key]) for key in VLLM_CONSTRAINTS if body.get(key) is not None]
    if len(found) > 1:
        raise BodyError(f"{found[1][0]} and {found[0][0]} both constrain the output; send one", found[1][0])
    _vllm_options(body, outputs or {}, draft)
    if not found:
        return None
    where, kind, value = found[0]
    if kind == "json":
        strict = bool(draft.values.get("constraint_exact_only", False))
        return Constraint(where, set_json_schema(draft, value, where, strict=strict))
    if kind == "json_object":
        constrain_to_schema(draft, ANY_OBJECT)
    elif kind == "regex":
        draft.set_constraint("regex", _string(value, where))
    elif kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise BodyError(f"{where} must be a non-empty array of strings", where)
        draft.set_constraint("choice", {"options": list(value)})
    else:  # grammar: GBNF (llama.cpp, xgrammar) has "::=" rules; otherwise Lark (llguidance)
        text = _string(value, where)
        draft.set_constraint("grammar", {"syntax": ENUMS["GrammarSyntax"].read("ebnf" if "::=" in text else "lark"),
                                         "text": text})
    return Constraint(where)


def _vllm_options(body: dict[str, Any], outputs: dict[str, Any], draft: Draft) -> None:
    for key, field in VLLM_OPTIONS.items():
        value = outputs.get(key.rpartition(".")[2]) if key.startswith("structured_outputs.") else body.get(key)
        if value is None:
            continue
        if field == "constraint_backend":
            if value not in VLLM_BACKENDS:
                raise BodyError(f"{key} must be one of {', '.join(VLLM_BACKENDS)}", key)
            draft.values["constraint_backend"] = VLLM_BACKENDS[value]
            continue
        if not isinstance(value, bool):
            raise BodyError(f"{key} must be a boolean", key)
        if field == "constraint_exact_only":
            draft.values["constraint_exact_only"] = value
        elif field == "json_whitespace":  # vLLM's default is any whitespace; ours is compact
            draft.values["json_whitespace"] = ENUMS["JsonWhitespace"].read("compact" if value else "flexible")


def _string(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise BodyError(f"{where} must be a non-empty string", where)
    return value
