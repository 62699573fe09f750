"""A JSON value's schemas as plain alternatives, and the schema each member or item is under (issue 45's closer).

``branches`` turns a schema node into the plain schemas a value under it may satisfy: local ``$ref``s followed
(each once on a path), ``allOf`` members merged (properties and ``required`` joined), ``anyOf``/``oneOf``
branches each merged with the keywords beside them. ``member_schema`` and ``item_schema`` say what schema a
property or an array's ``index``-th item is under (``properties``, ``patternProperties``,
``additionalProperties``; ``prefixItems``, draft 4-7 tuples, ``items``, ``additionalItems``).
"""

from __future__ import annotations

import re
from typing import Any

from proctor.constraints.json_schema.keywords import resolve_pointer
from proctor.constraints.json_schema.pattern_text import shortest_completion

Schema = dict[str, Any]


def branches(node: Any, root: Any, seen: tuple[str, ...] = ()) -> list[Schema]:
    """``node``'s alternatives as plain schemas: local ``$ref``s followed, ``allOf`` merged, ``anyOf``/``oneOf``
    branches each merged with the keywords beside them (``True``: ``{}``; ``False``: none)."""
    if node is True:
        return [{}]
    if not isinstance(node, dict):
        return []
    if "$ref" in node:
        ref = str(node["$ref"])
        if not ref.startswith("#") or ref in seen:
            return []
        target = resolve_pointer(root, ref)
        if target is None:
            return []
        rest = {key: value for key, value in node.items() if key != "$ref"}
        merged = {**target, **rest} if isinstance(target, dict) else target
        return branches(merged, root, (*seen, ref))
    if "allOf" in node:
        merged = {key: value for key, value in node.items() if key != "allOf"}
        for member in node["allOf"]:
            for branch in branches(member, root, seen)[:1]:
                merged = merge_all_of(merged, branch)
        return branches(merged, root, seen)
    for combiner in ("anyOf", "oneOf"):
        if combiner in node:
            rest = {key: value for key, value in node.items() if key != combiner}
            out: list[Schema] = []
            for branch in node[combiner]:
                out += branches({**rest, **branch} if isinstance(branch, dict) else branch, root, seen)
            return out
    return [node]


def merge_all_of(into: Schema, other: Schema) -> Schema:
    merged = {**other, **into}
    if "properties" in into or "properties" in other:
        merged["properties"] = {**other.get("properties", {}), **into.get("properties", {})}
    if "required" in into or "required" in other:
        merged["required"] = list(dict.fromkeys([*into.get("required", []), *other.get("required", [])]))
    return merged


def of_type(options: list[Schema], kind: str) -> list[Schema]:
    """The options a value opened as ``kind`` can be under (all of them when none says so)."""
    wanted = {"object": ("object",), "array": ("array",), "string": ("string",),
              "number": ("number", "integer"), "literal": ("boolean", "null")}[kind]
    kept = []
    for option in options:
        declared = option.get("type")
        types = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else None
        if types is None or any(t in wanted for t in types):
            kept.append(option)
    return kept or options


def member_schema(options: list[Schema], name: str) -> Any:
    """The schema the member ``name`` is under, in the first of ``options``."""
    for option in options:
        properties = option.get("properties", {})
        if name in properties:
            return properties[name]
        for pattern, schema in option.get("patternProperties", {}).items():
            try:
                if re.search(pattern, name):
                    return schema
            except re.error:  # an ECMA-262 pattern Python does not read: not this one
                continue
        return option.get("additionalProperties", True)
    return True


def item_schema(options: list[Schema], index: int) -> Any:
    """The schema the ``index``-th item is under, in the first of ``options``."""
    for option in options:
        prefix = option.get("prefixItems")
        items = option.get("items", True)
        if isinstance(items, list):  # draft 4-7 tuples
            prefix, items = items, option.get("additionalItems", True)
        if prefix is not None and index < len(prefix):
            return prefix[index]
        return items
    return True


def item_schemas(option: Schema) -> list[Any]:
    """Every schema an item of ``option`` may be under."""
    items = option.get("items")
    found = [*option.get("prefixItems", []), *(items if isinstance(items, list) else [items] if items else [])]
    return found + ([option["additionalItems"]] if isinstance(option.get("additionalItems"), dict) else [])


def required_names(option: Schema, present: list[str]) -> list[str]:
    """``required``, and the names the members ``present`` (or so added) require through ``dependentRequired`` or
    draft 4-7 ``dependencies`` lists. A triggered schema dependency is not followed: ``DependentSchema``."""
    names = list(dict.fromkeys(name for name in option.get("required", []) if isinstance(name, str)))
    lists = {**(option.get("dependencies") or {}), **(option.get("dependentRequired") or {})}
    schemas = {**{k: v for k, v in (option.get("dependencies") or {}).items() if isinstance(v, dict | bool)},
               **(option.get("dependentSchemas") or {})}
    pending = [*present, *names]
    while pending:
        name = pending.pop()
        if name in schemas and schemas[name] not in (True, {}):
            raise DependentSchema(name)
        for needed in lists.get(name, []) if isinstance(lists.get(name), list) else []:
            if needed not in names:
                names.append(needed)
                pending.append(needed)
    return names


def members_to_write(option: Schema, present: list[str]) -> list[str]:
    """The members an object under ``option`` still needs besides ``present``, in the order the engines write
    them: the required ones (dependencies included) in ``properties``' order, then required ones it does not
    list, then optional properties up to ``minProperties``. Raises ``DependentSchema``."""
    properties = option.get("properties", {})
    required = required_names(option, present)
    order = [name for name in properties if name in required] + [name for name in required if name not in properties]
    order = [name for name in order if name not in present]
    optional = [name for name in properties if name not in present and name not in order]
    least = int(option.get("minProperties", 0))
    while len(present) + len(order) < least and optional:
        order.append(optional.pop(0))
    missing = least - len(present) - len(order)
    return order + (fresh_names(option, [*present, *order], missing) if missing > 0 else [])


def fresh_names(option: Schema, taken: list[str], count: int) -> list[str]:
    """Up to ``count`` short member names no listed property has and none of ``taken`` (a key is never written twice:
    constraints/key_memory/), so an object of pattern or additional members reaches ``minProperties``: each
    ``patternProperties`` pattern's shortest name and its variants by one character (``_variants``), then, where
    additional members are allowed, one and two letters matching no pattern."""
    properties = option.get("properties", {})
    patterns = [str(pattern) for pattern in option.get("patternProperties", {})]
    found: list[str] = []

    def take(name: str) -> bool:
        if name not in taken and name not in found and name not in properties:
            found.append(name)
        return len(found) >= count

    for pattern in patterns:
        shortest = shortest_completion(pattern)
        if shortest is None:
            continue
        for name in _variants(shortest):
            if shortest_completion(pattern, name) == "" and take(name):
                return found
    if option.get("additionalProperties", True) is not False:
        for name in (*_NAME_CHARS, *(a + b for a in _NAME_CHARS[:26] for b in _NAME_CHARS)):
            if not any(_matches(pattern, name) for pattern in patterns) and take(name):
                return found
    return found


_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"


def _variants(name: str) -> list[str]:
    """``name``, then it with one character changed, one added at the end, one added in front."""
    changed = [name[:i] + char + name[i + 1:] for i in range(len(name) - 1, -1, -1) for char in _NAME_CHARS]
    return [name, *changed, *(name + char for char in _NAME_CHARS), *(char + name for char in _NAME_CHARS)]


def _matches(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return True  # a pattern Python cannot read: a name it might match is not offered


class DependentSchema(ValueError):
    """A member present triggers a schema dependency (not covered: the object must then satisfy another schema)."""
