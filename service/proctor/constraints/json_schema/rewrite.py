"""Rewrites that keep a schema's meaning exactly, so an engine can enforce what it could not before.

Applied after ``dialect.normalize`` and before the guard. Each one is exact — an instance
is valid before iff it is valid after — and each has a property test
(tests/unit/test_schema_rewrite.py):

* ``oneOf`` whose branches are pairwise provably disjoint → ``anyOf`` (at most one branch can
  match, so "exactly one" is "at least one"). Disjoint: the branches' possible instance types do
  not meet (integer counts as a number), or both are objects that require one property with
  different ``const``/``enum`` values (the usual discriminated union), or top-level
  ``const``/``enum`` values differ.
* ``dependentRequired`` / ``dependentSchemas`` → an ``anyOf`` per dependency: the trigger
  property is absent (``properties: {p: false}``) or present together with what it needs.
* ``if``/``then``/``else`` whose ``if`` tests one property against ``const``/``enum`` on an
  object whose schema gives that property a finite set of values → ``anyOf`` of the two cases.
* ``allOf`` members whose keywords do not overlap the parent's (and do not interact through
  ``additionalProperties`` or ``items``) are merged into the parent.
* ``propertyNames`` folded into ``properties``/``patternProperties`` (``property_names``, issue 56).

A rewrite is skipped where a ``$ref`` points into the structure it would move; references
themselves are checked in ``refs``.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from proctor.constraints.json_schema.formats import with_pattern
from proctor.constraints.json_schema.keywords import (
    ANNOTATIONS,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_SINGLES,
    pointer,
    resolve_pointer,
)
from proctor.constraints.json_schema.property_names import fold_finite_patterns, fold_property_names
from proctor.constraints.json_schema.refs import deref
from proctor.constraints.json_schema.walk import RefIndex, reachable

MAX_DEPENDENCIES = 4  # one anyOf each; more would multiply the branches an engine explores
MAX_ENUM = 256
_TYPES = frozenset({"string", "integer", "float", "boolean", "null", "array", "object"})
_NEVER_MERGED = frozenset({"if", "then", "else", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef",
                           "$recursiveRef"})
_KEYS_MOVED = frozenset({"propertyNames", "properties", "patternProperties", "additionalProperties"})
_INTERACTING = (frozenset({"properties", "patternProperties", "additionalProperties", "unevaluatedProperties"}),
                frozenset({"prefixItems", "items", "unevaluatedItems", "contains"}))


def rewrite(schema: object) -> object:
    """The schema with every exact rewrite applied (a new object; the input is not changed)."""
    index = RefIndex.of(schema)
    refs = index.targets
    blocked = {kw for kw in ("oneOf", "allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
                             "propertyNames", "properties", "patternProperties", "additionalProperties")
               if any(f"/{kw}" in ref for ref in refs)}
    if _uses_unevaluated(schema):
        # unevaluated* read the annotations of in-place applicators: a rewrite that adds an anyOf
        # or allOf where there was a `not` or a dependency changes what they see. Leave those be.
        blocked |= {"not", "if", "then", "else", "dependentRequired", "dependentSchemas"}
    return _rewrite(schema, schema, blocked, "#", index)


def _uses_unevaluated(schema: object) -> bool:
    return any(isinstance(site.node, dict) and ("unevaluatedProperties" in site.node or "unevaluatedItems" in site.node)
               for site in reachable(schema))


def _rewrite(node: object, root: object, blocked: set[str], path: str = "#",
             refs: RefIndex | None = None) -> object:
    """The node, its subschemas first (schema positions, and ref targets kept under other keys)."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        at = pointer(path, key)
        if key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _rewrite(sub, root, blocked, pointer(at, name), refs) for name, sub in value.items()}
        elif key in SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_rewrite(sub, root, blocked, pointer(at, i), refs) for i, sub in enumerate(value)]
        elif key in SCHEMA_SINGLES:
            out[key] = _rewrite(value, root, blocked, at, refs)
        elif refs is not None:
            out[key] = refs.descend(value, at, lambda sub, where: _rewrite(sub, root, blocked, where, refs))
        else:
            out[key] = value
    out = with_pattern(out)
    if "not" not in blocked:
        negated = _not(out, root, blocked)
        if not isinstance(negated, dict):
            return negated
        out = negated
    if "oneOf" not in blocked:
        out = _one_of(out, root)
    if "dependentRequired" not in blocked and "dependentSchemas" not in blocked:
        out = _dependencies(out)
    if not blocked & {"if", "then", "else"}:
        out = _if_then_else(out, root)
    if "allOf" not in blocked:
        out = _merge_all_of(out)
    if not blocked & _KEYS_MOVED:
        out = fold_finite_patterns(fold_property_names(out))
    return out


# --- oneOf ------------------------------------------------------------------------------------

def _value_types(value: object) -> set[str]:
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return {"integer"}
    if isinstance(value, float):
        return {"float"}
    return {{str: "string", list: "array", dict: "object", type(None): "null"}.get(type(value), "null")}


def possible_types(node: object, root: object, depth: int = 0) -> set[str]:
    """Instance types ``node`` may accept (a superset is fine; "float": a number that is not an integer)."""
    if node is False:
        return set()
    if not isinstance(node, dict) or depth > 8:
        return set(_TYPES)
    types = set(_TYPES)
    declared = node.get("type")
    names = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else None
    if names is not None:
        allowed: set[str] = set()
        for name in names:
            allowed |= {"integer", "float"} if name == "number" else {name} if name in _TYPES else set()
        types &= allowed
    if "const" in node:
        types &= _value_types(node["const"])
    if isinstance(node.get("enum"), list):
        types &= set().union(*(_value_types(v) for v in node["enum"])) if node["enum"] else set()
    if isinstance(node.get("$ref"), str):
        target = resolve_pointer(root, node["$ref"])
        if target is not None:
            types &= possible_types(target, root, depth + 1)
    for member in node.get("allOf") or [] if isinstance(node.get("allOf"), list) else []:
        types &= possible_types(member, root, depth + 1)
    for kw in ("anyOf", "oneOf"):
        if isinstance(node.get(kw), list):
            types &= set().union(*(possible_types(m, root, depth + 1) for m in node[kw])) if node[kw] else set()
    return types


def _values(node: object) -> set[str] | None:
    """The finite set of values ``node`` admits (canonical JSON), when it says so with const/enum."""
    if not isinstance(node, dict):
        return None
    if "const" in node:
        return {_canonical(node["const"])}
    if isinstance(node.get("enum"), list):
        return {_canonical(v) for v in node["enum"]}
    return None


def _canonical(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _discriminators(branch: object, root: object) -> dict[str, set[str]]:
    """property → values, for each required property of an object-only branch with const/enum values."""
    branch = deref(branch, root)
    if not isinstance(branch, dict) or possible_types(branch, root) - {"object"}:
        return {}
    props: dict[str, Any] = branch["properties"] if isinstance(branch.get("properties"), dict) else {}
    required: list[object] = branch["required"] if isinstance(branch.get("required"), list) else []
    found: dict[str, set[str]] = {}
    for name in required:
        values = _values(deref(props.get(name), root)) if isinstance(name, str) else None
        if isinstance(name, str) and values is not None:
            found[name] = values
    return found


def disjoint(a: object, b: object, root: object) -> bool:
    """Whether no instance can satisfy both ``a`` and ``b`` (False when it cannot be shown)."""
    if not possible_types(a, root) & possible_types(b, root):
        return True
    values_a, values_b = _values(deref(a, root)), _values(deref(b, root))
    if values_a is not None and values_b is not None and not values_a & values_b:
        return True
    da, db = _discriminators(a, root), _discriminators(b, root)
    return any(not (da[name] & db[name]) for name in da.keys() & db.keys())


def _one_of(node: dict[str, Any], root: object) -> dict[str, Any]:
    branches = node.get("oneOf")
    if not isinstance(branches, list) or "anyOf" in node:
        return node
    if all(disjoint(a, b, root) for a, b in itertools.combinations(branches, 2)):
        return {("anyOf" if k == "oneOf" else k): v for k, v in node.items()}
    return node


# --- not ---------------------------------------------------------------------------------------

_ALL_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")


def _not(node: dict[str, Any], root: object, blocked: set[str]) -> object:
    """``not`` restated positively where that is exact; the node (or ``False``) after it."""
    if "not" not in node:
        return node
    sub = deref(node["not"], root)
    rest = {k: v for k, v in node.items() if k != "not"}
    if sub is True or (isinstance(sub, dict) and not {k for k in sub if k not in ANNOTATIONS}):
        return False  # not {}: nothing is valid
    if sub is False:
        return rest
    if not isinstance(sub, dict):
        return node
    keys = {k for k in sub if k not in ANNOTATIONS}
    if keys == {"not"}:  # not not X = X
        return _rewrite(_add_all_of(rest, [sub["not"]]), root, blocked)
    if keys == {"anyOf"} and isinstance(sub["anyOf"], list):  # not (A or B) = not A and not B
        return _rewrite(_add_all_of(rest, [{"not": branch} for branch in sub["anyOf"]]), root, blocked)
    if keys == {"allOf"} and isinstance(sub["allOf"], list) and sub["allOf"]:  # not (A and B) = not A or not B
        return _rewrite(_add_any_ofs(rest, [[{"not": member} for member in sub["allOf"]]]), root, blocked)
    if keys == {"required"} and isinstance(sub["required"], list) and sub["required"] \
            and all(isinstance(n, str) for n in sub["required"]):
        # required holds for anything that is not an object: only objects missing a name pass `not`.
        absent = [{"properties": {name: False}} for name in dict.fromkeys(sub["required"])]
        case = {"type": "object", **({"anyOf": absent} if len(absent) > 1 else absent[0])}
        return _add_all_of(rest, [case])
    if keys == {"type"}:
        return _not_type(rest, sub["type"], node)
    return node


def _not_type(rest: dict[str, Any], excluded: object, node: dict[str, Any]) -> object:
    names = {excluded} if isinstance(excluded, str) else set(excluded) if isinstance(excluded, list) else None
    if names is None or not names <= set(_ALL_TYPES) or ("integer" in names and "number" not in names):
        return node  # "a number that is not an integer" has no type name
    if "number" in names:
        names.add("integer")
    declared = rest.get("type")
    current = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else list(_ALL_TYPES)
    if "number" in current and "integer" in names and "number" not in names:
        return node
    kept = [t for t in current if t not in names]
    if not kept:
        return False
    return {**rest, "type": kept[0] if len(kept) == 1 else kept}


def _add_all_of(node: dict[str, Any], members: list[object]) -> dict[str, Any]:
    existing = list(node.get("allOf") or []) if isinstance(node.get("allOf"), list) else []
    return {**node, "allOf": existing + members}


# --- dependencies -----------------------------------------------------------------------------

def _dependencies(node: dict[str, Any]) -> dict[str, Any]:
    required = node.get("dependentRequired")
    schemas = node.get("dependentSchemas")
    required = required if isinstance(required, dict) else {}
    schemas = schemas if isinstance(schemas, dict) else {}
    if not (required or schemas) or len(required) + len(schemas) > MAX_DEPENDENCIES:
        return node
    if any(not isinstance(v, list) for v in required.values()):
        return node
    cases = []
    for name, needed in required.items():
        # The dependents before the trigger: engines write required names in list order.
        cases.append([{"properties": {name: False}}, {"required": list(dict.fromkeys([*needed, name]))}])
    for name, sub in schemas.items():
        cases.append([{"properties": {name: False}}, {"required": [name], "allOf": [sub]}])
    out = {k: v for k, v in node.items() if k not in ("dependentRequired", "dependentSchemas")}
    return _add_any_ofs(out, cases)


def _add_any_ofs(node: dict[str, Any], cases: list[list[object]]) -> dict[str, Any]:
    """Require each list of ``cases`` as an anyOf beside what ``node`` already says."""
    if len(cases) == 1 and "anyOf" not in node:
        return {**node, "anyOf": cases[0]}
    members = list(node.get("allOf") or []) if isinstance(node.get("allOf"), list) else []
    return {**node, "allOf": members + [{"anyOf": c} for c in cases]}


# --- if / then / else -------------------------------------------------------------------------

def _if_then_else(node: dict[str, Any], root: object) -> dict[str, Any]:
    test = node.get("if")
    if not isinstance(test, dict) or node.get("type") != "object":
        return node
    keys = {k for k in test if k not in ANNOTATIONS}
    props = test.get("properties")
    if not keys <= {"properties", "required", "type"} or not isinstance(props, dict) or len(props) != 1:
        return node
    (name, condition), = props.items()
    values = _values(condition)
    required = test.get("required", [])
    if values is None or test.get("type", "object") != "object" or not isinstance(required, list) \
            or not set(required) <= {name} or not isinstance(condition, dict) \
            or {k for k in condition if k not in ANNOTATIONS} - {"const", "enum"}:
        return node
    parent_props: dict[str, Any] = node["properties"] if isinstance(node.get("properties"), dict) else {}
    domain = _domain(deref(parent_props.get(name), root))
    if domain is None:
        return node
    then, otherwise = node.get("then", True), node.get("else", True)
    hit = [json.loads(v) for v in sorted(values & domain)]
    miss = [json.loads(v) for v in sorted(domain - values)]
    branches: list[object] = []
    if hit:
        branches.append({"properties": {name: {"enum": hit}}, **({"required": [name]} if required else {}),
                         "allOf": [then]})
    elif not required:  # no listed value triggers `if`, but an absent property does
        branches.append({"properties": {name: False}, "allOf": [then]})
    if miss:
        branches.append({"required": [name], "properties": {name: {"enum": miss}}, "allOf": [otherwise]})
    if required:
        branches.append({"properties": {name: False}, "allOf": [otherwise]})
    if not branches:
        return node
    out = {k: v for k, v in node.items() if k not in ("if", "then", "else")}
    return _add_any_ofs(out, [branches])


def _domain(node: object) -> set[str] | None:
    """The finite set of values a property schema allows (enum/const, or boolean), if it has one."""
    values = _values(node)
    if values is not None:
        return values if len(values) <= MAX_ENUM else None
    if isinstance(node, dict) and node.get("type") == "boolean":
        return {"true", "false"}
    return None


# --- allOf ------------------------------------------------------------------------------------

def _merge_all_of(node: dict[str, Any]) -> dict[str, Any]:
    members = node.get("allOf")
    if not isinstance(members, list):
        return node
    out = {k: v for k, v in node.items() if k != "allOf"}
    kept = []
    for member in members:
        if member is True or member == {}:
            continue
        if not isinstance(member, dict) or not _mergeable(out, member):
            kept.append(member)
            continue
        for key, value in member.items():
            if key == "required" and key in out:
                out[key] = list(dict.fromkeys([*out[key], *value]))
            elif key == "properties" and key in out:
                out[key] = {**out[key], **value}
            elif key not in out:
                out[key] = value
    if kept:
        out["allOf"] = kept
    return out


def _mergeable(node: dict[str, Any], member: dict[str, Any]) -> bool:
    """Whether member's keywords can sit in node without changing what either means."""
    if any(k in member for k in ("$id", "$defs", "definitions", "$schema", "$anchor")):
        return False
    if (node.keys() | member.keys()) & _NEVER_MERGED:
        return False  # they read the annotations of their siblings, or each other
    if "$ref" in node or "$ref" in member:
        return False  # engines take a (possibly recursive) $ref best alone: llguidance refuses cycles with siblings
    for key in (node.keys() & member.keys()) - ANNOTATIONS:
        lists = isinstance(node[key], list) and isinstance(member[key], list)
        maps = isinstance(node[key], dict) and isinstance(member[key], dict)
        if not (key == "required" and lists) and not (key == "properties" and maps
                                                         and not node[key].keys() & member[key].keys()):
            return False
    objects, arrays = _INTERACTING
    if node.keys() & objects and member.keys() & objects and (node.keys() | member.keys()) & objects != {"properties"}:
        return False  # additionalProperties & co. read their siblings' property names
    return not (node.keys() & arrays and member.keys() & arrays)
