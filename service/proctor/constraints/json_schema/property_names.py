"""``propertyNames`` folded into the keys an object lists, exactly, so the engines enforce names as keys are written.

No engine enforces ``propertyNames`` (llguidance refuses it); every one enforces ``properties`` with
``additionalProperties: false`` and ``patternProperties``, and writes keys under them character by character. So
(issue 56), on an object schema:

* names from a finite set (``enum``/``const``, filtered by the rest of the name schema, as the validator reads it)
  → those names as ``properties``, each under the schema a member of that name is under (its ``properties`` entry
  and every matching ``patternProperties`` one, else ``additionalProperties``), and ``additionalProperties: false``;
* names by ``pattern`` alone, or by ``minLength``/``maxLength`` alone, on a map (no ``properties``, no
  ``patternProperties``) → ``patternProperties: {pattern: additionalProperties}`` and ``additionalProperties:
  false``;
* ``propertyNames: false`` → ``maxProperties: 0``; ``true`` or ``{}`` → dropped.

And (``fold_finite_patterns``) an object that takes only ``properties`` and ``patternProperties`` keys whose patterns
match a few names each (``^(red|green)$``, ``^k[0-9]$``) lists those names as ``properties``: the engines would
otherwise let the model start a member after every name is written, whose key the key memory must then refuse at
every ending (a dead end). Listed, the engines offer each name once.

Each is exact: an object is valid before iff it is valid after. Anything else is left as written (the guard names
it and the validated fallback serves it). A required name outside the allowed set makes the schema unsatisfiable;
left as written too.
"""

from __future__ import annotations

import re
from typing import Any

from proctor.constraints.json_schema.keywords import ANNOTATIONS
from proctor.constraints.json_schema.pattern_text import finite_names

MAX_NAMES = 256  # an enum of more names is left to the fallback (each becomes a property of the engine's grammar)
_ANY_CHAR = "(.|[\\n\\r\\u2028\\u2029])"  # any one character (``.`` leaves out ECMA's line terminators)
_NAME_KEYWORDS = frozenset({"type", "enum", "const", "pattern", "minLength", "maxLength"})


def fold_property_names(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with ``propertyNames`` folded into its keys where that is exact (else ``node`` itself)."""
    names = node.get("propertyNames")
    if names is None:
        return node
    rest = {key: value for key, value in node.items() if key != "propertyNames"}
    if names is True or names == {}:
        return rest
    if names is False:
        return {**rest, "maxProperties": 0} if "maxProperties" not in rest else node
    if not isinstance(names, dict) or "unevaluatedProperties" in node:
        return node
    asserted = {key for key in names if key not in ANNOTATIONS}
    if not asserted <= _NAME_KEYWORDS or not _types_strings(names.get("type", "string")):
        return node
    if "enum" in names or "const" in names:
        return _finite(node, rest, names) or node
    return _by_pattern(rest, names) or node


def fold_finite_patterns(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with each name its ``patternProperties`` admit listed as a property, when no other key is admitted
    (``additionalProperties: false``) and the patterns match ``MAX_NAMES`` names in all (else ``node`` itself)."""
    patterns = node.get("patternProperties")
    if node.get("additionalProperties", True) is not False or not isinstance(patterns, dict) or not patterns:
        return node
    properties = node.get("properties") or {}
    if not isinstance(properties, dict):
        return node
    names: dict[str, None] = dict.fromkeys(properties)
    for pattern in patterns:
        found = finite_names(pattern, MAX_NAMES) if isinstance(pattern, str) else None
        if found is None or any(_search(pattern, name) is not True for name in found):
            return node  # infinitely many, too many, or read differently by Python's re: left as written
        names.update(dict.fromkeys(found))
    if len(names) > MAX_NAMES:
        return node
    return _listed(node, node, list(names)) or node


def _types_strings(declared: object) -> bool:
    return declared == "string" or (isinstance(declared, list) and "string" in declared)


def _finite(node: dict[str, Any], rest: dict[str, Any], names: dict[str, Any]) -> dict[str, Any] | None:
    values = [names["const"]] if "const" in names else names["enum"]
    if not isinstance(values, list) or len(values) > MAX_NAMES:
        return None
    try:
        strings = dict.fromkeys(value for value in values if isinstance(value, str))
        allowed = [value for value in strings if _name_fits(value, names)]
    except _Unreadable:
        return None
    required = node.get("required", [])
    if not isinstance(required, list) or any(name not in allowed for name in required):
        return None
    listed = _listed(node, rest, allowed)
    return {**listed, "additionalProperties": False} if listed is not None else None


def _listed(node: dict[str, Any], rest: dict[str, Any], names: list[str]) -> dict[str, Any] | None:
    """``rest`` with ``names`` as its only keys, each under every schema a member of that name is under in ``node``
    (None: a pattern Python cannot read)."""
    properties: dict[str, Any] = {}
    for name in names:
        member = _member_schema(node, name)
        if member is None:
            return None
        properties[name] = member
    out = {key: value for key, value in rest.items() if key not in ("properties", "patternProperties")}
    return {**out, "properties": properties}


def _name_fits(name: str, names: dict[str, Any]) -> bool:
    length = len(name)
    if "minLength" in names and length < names["minLength"]:
        return False
    if "maxLength" in names and length > names["maxLength"]:
        return False
    if "pattern" in names:
        found = _search(str(names["pattern"]), name)
        if found is None:
            raise _Unreadable
        return found
    return True


def _member_schema(node: dict[str, Any], name: str) -> Any:
    """Every schema the member ``name`` is under in ``node`` (None: a pattern Python cannot read)."""
    applied: list[Any] = []
    properties = node.get("properties") or {}
    if name in properties:
        applied.append(properties[name])
    for pattern, schema in (node.get("patternProperties") or {}).items():
        found = _search(pattern, name)
        if found is None:
            return None
        if found:
            applied.append(schema)
    if not applied:
        applied.append(node.get("additionalProperties", True))
    return applied[0] if len(applied) == 1 else {"allOf": applied}


def _by_pattern(rest: dict[str, Any], names: dict[str, Any]) -> dict[str, Any] | None:
    if "properties" in rest or "patternProperties" in rest:
        return None
    has_pattern = "pattern" in names
    has_length = "minLength" in names or "maxLength" in names
    if has_pattern == has_length:  # neither, or both (no intersection of the two in one pattern)
        return None
    if has_pattern:
        pattern = names["pattern"]
        if not isinstance(pattern, str):
            return None
    else:
        low, high = names.get("minLength", 0), names.get("maxLength")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high if high is not None else 0)):
            return None
        pattern = f"^{_ANY_CHAR}{{{low},{'' if high is None else high}}}$"
    extra = rest.get("additionalProperties", True)
    return {**rest, "patternProperties": {pattern: extra}, "additionalProperties": False}


def _search(pattern: str, name: str) -> bool | None:
    """Whether ``pattern`` matches somewhere in ``name`` (None: Python cannot read the pattern)."""
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return None


class _Unreadable(ValueError):
    """A name pattern Python cannot read."""
