"""The shortest valid value of a JSON schema: the first piece of closing a constrained output within its token
budget (issue 45), where a row that runs short writes the shortest valid ending instead of being cut off.

Why here and not in a constraint engine: neither xgrammar nor llguidance says how far its current state is from an
accepting one, and the token-level search they would need is over the whole vocabulary at every step. A schema
says it directly: a required property's shortest value, an array's ``minItems`` copies of its items' shortest
value, an enum's shortest member, a string of ``minLength`` characters, the number nearest zero in bounds.

``shortest_value`` covers the common keywords (``type`` and its lists, ``const``, ``enum``, ``properties`` with
``required``, ``minProperties`` from the optional properties, ``items``/``prefixItems`` with ``minItems``,
``minLength``/``maxLength``, common ``format``s, ``pattern``s (``pattern_text``), number bounds and
``multipleOf``, ``anyOf``/``oneOf``, one-member ``allOf``, local ``$ref``s) and says plainly what it does not
(``None``): a pattern with lookarounds, ``not``, ``uniqueItems`` with more than one item, ``if``/``then``.
Whatever it returns is checked with the server's own validator first, so a value it gives is valid, never merely
likely to be.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from proctor.constraints.json_schema.keywords import resolve_pointer
from proctor.constraints.json_schema.options import DependentSchema, member_schema, members_to_write
from proctor.constraints.json_schema.pattern_text import shortest_completion
from proctor.constraints.json_schema.validation import validate_json_output

FORMATS = {"date": "2000-01-01", "date-time": "2000-01-01T00:00:00Z", "time": "00:00:00Z", "email": "a@b.co",
           "uri": "a:b", "uuid": "00000000-0000-0000-0000-000000000000", "ipv4": "0.0.0.0", "ipv6": "::",
           "hostname": "a", "duration": "P1D"}
_DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
_TIME = r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# The formats a closer completes once begun (``closer``): the shortest text to a match, from
# what was written (``pattern_text``). Simple forms: what they give is valid, not every valid value.
FORMAT_PATTERNS = {"date": f"^{_DATE}$", "time": f"^{_TIME}$", "date-time": f"^{_DATE}T{_TIME}$",
                   "uuid": "^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$",
                   "ipv4": f"^({_OCTET}\\.){{3}}{_OCTET}$",
                   "email": "^[A-Za-z0-9._+-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*\\.[A-Za-z]{2,}$",
                   "hostname": "^[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*$", "uri": "^[A-Za-z][A-Za-z0-9+.-]*:[^ ]*$"}
UNCOVERED = ("not", "if", "then", "else", "contains")
TYPE_ORDER = ("null", "boolean", "integer", "number", "string", "array", "object")  # by the shortest each can be


class NotCovered(ValueError):
    """The schema has what ``shortest_value`` does not compute (named in the message)."""


@dataclass(frozen=True, slots=True)
class Shortest:
    value: Any
    text: str  # compact JSON: what a closer writes


def shortest_value(schema: dict[str, Any] | bool) -> Shortest | None:
    """The shortest valid value of ``schema`` (checked with the server's validator), or None where it is not
    covered."""
    try:
        value = _shortest(schema, schema, ())
    except (NotCovered, RecursionError, KeyError, TypeError, ValueError):
        return None
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if not validate_json_output(text, schema, truncated=False).valid:
        return None
    return Shortest(value, text)


def shortest_text(node: Any, root: Any) -> str | None:
    """The compact JSON text of the shortest value of ``node``, a part of the schema ``root`` (its ``$ref``s
    resolved against it), unchecked: the closer's guesses are checked by the matcher (``closer``)."""
    try:
        return json.dumps(_shortest(node, root, ()), separators=(",", ":"), ensure_ascii=False)
    except (NotCovered, RecursionError, KeyError, TypeError, ValueError, IndexError):
        return None


def _length(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def _shortest(node: Any, root: Any, seen: tuple[str, ...]) -> Any:
    if node is True or node == {}:
        return 0
    if node is False or not isinstance(node, dict):
        raise NotCovered("a schema that admits nothing")
    if "$ref" in node:
        ref = str(node["$ref"])
        if not ref.startswith("#") or ref in seen:
            raise NotCovered(f"$ref {ref}")
        rest = {key: value for key, value in node.items() if key != "$ref"}
        target = resolve_pointer(root, ref)
        if target is None:
            raise NotCovered(f"$ref {ref}")
        return _shortest({**target, **rest} if rest and isinstance(target, dict) else target, root, (*seen, ref))
    for keyword in UNCOVERED:
        if keyword in node:
            raise NotCovered(keyword)
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return min(node["enum"], key=_length)
    for combiner in ("anyOf", "oneOf"):
        if combiner in node:
            rest = {key: value for key, value in node.items() if key != combiner}
            found = []
            for branch in node[combiner]:
                try:
                    found.append(_shortest({**rest, **branch} if isinstance(branch, dict) else branch, root, seen))
                except NotCovered:
                    continue
            if not found:
                raise NotCovered(combiner)
            return min(found, key=_length)
    if "allOf" in node:
        if len(node["allOf"]) != 1:
            raise NotCovered("allOf of several")
        rest = {key: value for key, value in node.items() if key != "allOf"}
        return _shortest({**rest, **node["allOf"][0]}, root, seen)
    types = node.get("type")
    candidates = [types] if isinstance(types, str) else list(types) if isinstance(types, list) else _implied(node)
    for kind in sorted(candidates, key=TYPE_ORDER.index):
        return _of_type(kind, node, root, seen)
    raise NotCovered("no type")


def _implied(node: dict[str, Any]) -> list[str]:
    """The type a schema without ``type`` implies by its keywords (any: the shortest JSON, 0)."""
    if {"properties", "required", "minProperties"} & set(node):
        return ["object"]
    if {"items", "prefixItems", "minItems"} & set(node):
        return ["array"]
    if {"minLength", "maxLength", "format"} & set(node):
        return ["string"]
    return ["integer"]


def _of_type(kind: str, node: dict[str, Any], root: Any, seen: tuple[str, ...]) -> Any:
    if kind == "null":
        return None
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        return _number(node, kind == "integer")
    if kind == "string":
        if "format" in node and node["format"] in FORMATS:
            return FORMATS[node["format"]]
        if "pattern" in node:
            matched = shortest_completion(str(node["pattern"]))
            if matched is None or len(matched) < int(node.get("minLength", 0)):
                raise NotCovered("pattern")
            return matched
        return "a" * int(node.get("minLength", 0))
    if kind == "array":
        prefix = [_shortest(item, root, seen) for item in node.get("prefixItems", [])]
        count = max(0, int(node.get("minItems", 0)) - len(prefix))
        if count and node.get("uniqueItems") and count + len(prefix) > 1:
            raise NotCovered("uniqueItems")
        items = node.get("items", True)
        return prefix + ([_shortest(items, root, seen)] * count if count else [])
    if kind == "object":
        try:
            order = members_to_write(node, [])
        except DependentSchema as exc:
            raise NotCovered(f"dependency of {exc}") from exc
        return {name: _shortest(member_schema([node], name), root, seen) for name in order}
    raise NotCovered(f"type {kind}")


def _number(node: dict[str, Any], integer: bool) -> int | float:
    """The number of the shortest text in bounds: 0, 1, -1, else the bounds' nearest whole numbers and multiples,
    else a bound itself (whole numbers first: no decimals, no exponent)."""
    low, high = _bound(node, "minimum", "exclusiveMinimum"), _bound(node, "maximum", "exclusiveMaximum")
    step = node.get("multipleOf")
    candidates: list[float] = [0, 1, -1]
    for bound, direction in ((low, 1), (high, -1)):
        if bound is not None:
            whole = math.ceil(bound[0]) if direction > 0 else math.floor(bound[0])
            candidates += [whole, whole + direction, bound[0]]
            if step:
                multiple = (math.ceil if direction > 0 else math.floor)(bound[0] / step) * step
                candidates += [multiple, multiple + direction * step]
    for value in sorted(candidates, key=lambda value: (len(_number_text(value)), abs(value))):
        if number_fits(value, node, integer):
            return int(value) if float(value).is_integer() else value
    raise NotCovered("number bounds")


def number_fits(value: float, node: dict[str, Any], integer: bool) -> bool:
    """Whether ``value`` is within ``node``'s bounds and ``multipleOf`` (and whole, for an integer)."""
    low, high = _bound(node, "minimum", "exclusiveMinimum"), _bound(node, "maximum", "exclusiveMaximum")
    step = node.get("multipleOf")
    if low is not None and (value < low[0] or (low[1] and value == low[0])):
        return False
    if high is not None and (value > high[0] or (high[1] and value == high[0])):
        return False
    if isinstance(step, (int, float)) and step:
        try:
            if abs(value / step - round(value / step)) > 1e-9:
                return False
        except (OverflowError, ValueError):  # a number too large for a float: not one the closer writes
            return False
    return not integer or isinstance(value, int) or float(value).is_integer()  # an int may be past a float's range


def _bound(node: dict[str, Any], inclusive: str, exclusive: str) -> tuple[float, bool] | None:
    """(value, exclusive) of a bound: draft 6+ ``exclusiveMinimum: N``, or draft 4's ``minimum`` + a boolean."""
    flag = node.get(exclusive)
    if isinstance(flag, (int, float)) and not isinstance(flag, bool):
        return float(flag), True
    if isinstance(node.get(inclusive), (int, float)):
        return float(node[inclusive]), flag is True
    return None


def _number_text(value: float) -> str:
    return json.dumps(int(value) if float(value).is_integer() else value)
