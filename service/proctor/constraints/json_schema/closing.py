"""Closing a schema's objects: ``additionalProperties: false`` where an object lists its properties and says
nothing about the rest.

JSON Schema leaves such an object open, and a weak model fills the room with keys it invents until the token
limit (README: OpenAI-compatible HTTP API). OpenAI's strict mode defines every object as closed, and the
servers people self-host close them whatever ``strict`` says (vLLM and SGLang through xgrammar's
``strict_mode``, llama-server's schema converter), so the HTTP door serves its schemas closed.

Closing only narrows: an instance valid under the closed schema is valid under the original (a property
test checks it on real schemas), so the output still validates against what the caller sent. Where a
``false`` would change what other keywords mean it is not added:

- an object that already says ``additionalProperties`` or ``unevaluatedProperties``, or lists no
  ``properties``/``patternProperties`` (a free-form map, as ``dict[str, Any]`` gives);
- an object whose properties are spread over in-place applicators (``allOf``, ``anyOf``, ``$ref``...
  beside its own ``properties``): ``additionalProperties`` sees only its siblings, so closing would
  refuse the others' keys; nor the members of such a composition, or of any ``allOf``;
- anything under ``not`` or ``if``, where a stricter subschema makes the whole looser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proctor.constraints.json_schema.keywords import NEGATIVE, SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_SINGLES, pointer

ALWAYS_COMPOSED = ("dependentSchemas", "then", "else")  # members that never stand alone


@dataclass(frozen=True, slots=True)
class ClosedSchema:
    """The schema with its objects closed, and the JSON pointers of the objects that were."""

    schema: Any
    closed: tuple[str, ...]


def close_objects(schema: Any) -> ClosedSchema:
    """``schema`` (not changed) with every object that lists its properties closed, as the module says."""
    composed_refs = _composed_refs(schema, False)
    closed: list[str] = []
    return ClosedSchema(_close(schema, "#", False, composed_refs, closed), tuple(closed))


def _lists_properties(node: dict[str, Any]) -> bool:
    return isinstance(node.get("properties"), dict) or isinstance(node.get("patternProperties"), dict)


def _member_composed(node: dict[str, Any], key: str) -> bool:
    """Whether the subschemas under ``key`` share the instance's keys with others (so none may close alone)."""
    if key in ALWAYS_COMPOSED:
        return True
    beside = _lists_properties(node) or "$ref" in node
    if key == "allOf":  # a lone member (pydantic's wrapper for a described $ref) stands alone
        return beside or len(node["allOf"]) > 1
    return key in ("anyOf", "oneOf") and beside


def _spread(node: dict[str, Any]) -> bool:
    """Whether ``node``'s in-place applicators add properties of their own (or may, through a ``$ref``)."""
    if "$ref" in node:
        return True
    members: list[Any] = []
    for key in ("allOf", "anyOf", "oneOf"):
        members += node[key] if isinstance(node.get(key), list) else []
    members += [node[key] for key in ("then", "else") if key in node]
    if isinstance(node.get("dependentSchemas"), dict):
        members += list(node["dependentSchemas"].values())
    return any(isinstance(m, dict) and (_lists_properties(m) or "$ref" in m or _spread(m)) for m in members)


def _children(node: dict[str, Any]) -> list[tuple[tuple[str | int, ...], Any, bool]]:
    """(pointer tokens, subschema, composed) below ``node``, outside ``not`` and ``if``."""
    out: list[tuple[tuple[str | int, ...], Any, bool]] = []
    for key in SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out += [((key, name), sub, _member_composed(node, key)) for name, sub in node[key].items()]
    for key in SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out += [((key, index), sub, _member_composed(node, key)) for index, sub in enumerate(node[key])]
    out += [((key,), node[key], _member_composed(node, key)) for key in SCHEMA_SINGLES
            if key in node and key not in NEGATIVE]
    return out


def _close(node: Any, path: str, composed: bool, composed_refs: set[str], closed: list[str]) -> Any:
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for tokens, sub, member_composed in _children(node):
        value = _close(sub, pointer(path, *tokens), member_composed, composed_refs, closed)
        if len(tokens) == 1:
            out[str(tokens[0])] = value
        else:
            key, at = str(tokens[0]), tokens[1]
            if out[key] is node[key]:  # the first change below this keyword copies its map or list
                out[key] = dict(node[key]) if isinstance(node[key], dict) else list(node[key])
            out[key][at] = value
    if (_lists_properties(node) and "additionalProperties" not in node and "unevaluatedProperties" not in node
            and not composed and not _spread(node) and path not in composed_refs):
        out["additionalProperties"] = False
        closed.append(path)
    return out


def _composed_refs(node: Any, composed: bool) -> set[str]:
    """The targets of ``$ref``s in a composition: closing such a target would refuse its partners' keys."""
    if not isinstance(node, dict):
        return set()
    found = {node["$ref"]} if isinstance(node.get("$ref"), str) and (composed or _lists_properties(node)) else set()
    for _, sub, member_composed in _children(node):
        found |= _composed_refs(sub, member_composed)
    return found
