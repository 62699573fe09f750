"""Soundness guard for JSON Schemas: refuse what an engine would silently not enforce.

Every engine compiles some keywords faithfully, refuses some, and silently ignores others (the
output then looks constrained but may violate the schema). This module lists, per engine, the
keywords it enforces and the conditions under which it does; anything else is reported so the
adapter can refuse the schema before compiling. The lists come from running the JSON Schema Test
Suite (draft 2020-12, with ``optional/format``) and targeted probes through each engine with the
real tokenizer: a keyword is allowed only where no invalid instance got through. An allowlist,
so a keyword nobody checked (or a misspelled one) is refused rather than ignored.

Known gaps that no keyword list can express are documented in the adapters' module docstrings.
"""

from __future__ import annotations

from dataclasses import dataclass

from proctor.constraints.backend import ConstraintError
from proctor.constraints.backends.ecma_regex import takes_json_escaped, translate
from proctor.constraints.spec import canonical_json

DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_BYTES = 1 << 20

# Keywords that never constrain an instance (``$id`` only at the root: elsewhere it re-bases $ref).
# OpenAPI's ``discriminator`` is a hint beside oneOf/anyOf, which still decide validity.
ANNOTATIONS = frozenset({
    "title", "description", "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly",
    "$schema", "$defs", "definitions", "contentMediaType", "contentEncoding", "contentSchema", "discriminator",
})
TYPE_KEYWORDS = {
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains", "minContains",
                        "maxContains", "unevaluatedItems"}),
    "object": frozenset({"properties", "required", "additionalProperties", "patternProperties", "minProperties",
                         "maxProperties", "propertyNames", "dependentRequired", "dependentSchemas",
                         "unevaluatedProperties"}),
}
KEYWORD_TYPE = {kw: t for t, kws in TYPE_KEYWORDS.items() for kw in kws}
JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "array", "object"})

# Subschema positions, for the walk.
SCHEMA_MAPS = ("$defs", "definitions", "properties", "patternProperties", "dependentSchemas")
SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
SCHEMA_SINGLES = ("items", "additionalProperties", "contains", "not", "if", "then", "else", "propertyNames",
                  "unevaluatedItems", "unevaluatedProperties")


@dataclass(frozen=True)
class Policy:
    """What one engine enforces, and the conditions under which it does."""

    keywords: frozenset[str]
    formats: frozenset[str]
    approximate_formats: frozenset[str] = frozenset()
    typed: bool = False  # type-specific keywords count only beside a ``type`` that admits them
    single_type: bool = False  # ... and only when ``type`` is one string, not a list
    exclusive: frozenset[str] = frozenset()  # keywords whose constraint siblings the engine drops
    closed_by_default: bool = False  # objects without additionalProperties admit no other keys
    required_in_properties: bool = False  # required names outside properties are ignored
    closed_with_properties: bool = False  # open additionalProperties beside properties lets "\\u0061" in
    disjoint_pattern_properties: bool = False  # a key in properties and patternProperties gets one schema
    single_all_of: bool = False  # allOf is read as its only member, never intersected
    integer_multiple_of: bool = False  # multipleOf holds only for integers
    plain_literals: bool = False  # const/enum strings lose characters that need a \\u escape
    raw_patterns: bool = False  # patterns see raw JSON text: taking '"', '\\' or a control char is unsound
    length_drops_pattern: bool = False  # minLength/maxLength beside pattern/format: pattern/format is dropped
    pattern_drops_length: bool = False  # ... the other way round: minLength/maxLength are dropped


_COMMON = frozenset({"type", "enum", "const", "anyOf", "$ref", "minLength", "maxLength", "pattern", "format", "items",
                     "minItems", "maxItems", "properties", "required", "additionalProperties"})
_NUMBER = TYPE_KEYWORDS["number"]
# date/date-time/time: calendar checks (days per month, leap years, leap seconds) are not enforced.
_CALENDAR = frozenset({"date", "date-time", "time"})

POLICIES: dict[str, Policy] = {
    # llguidance refuses what it does not implement (with lenient off) but ignores unknown keys.
    "llguidance": Policy(
        keywords=_COMMON | _NUMBER | {"prefixItems", "oneOf", "allOf", "patternProperties", "minProperties",
                                      "maxProperties"},
        formats=frozenset({"duration", "email", "ipv4", "ipv6", "uri", "uuid"}),
        approximate_formats=_CALENDAR,
        plain_literals=True,
    ),
    # xgrammar reads an untyped node as any JSON, drops siblings of enum/const/anyOf/allOf/$ref,
    # reads allOf as its first member, ignores required names outside properties and float multipleOf.
    "xgrammar": Policy(
        keywords=_COMMON | _NUMBER | {"prefixItems", "allOf", "patternProperties", "minProperties", "maxProperties"},
        formats=frozenset({"duration", "email", "ipv4", "json-pointer", "relative-json-pointer", "uri",
                           "uri-reference", "uri-template", "uuid"}),
        approximate_formats=_CALENDAR,
        typed=True,
        exclusive=frozenset({"enum", "const", "anyOf", "allOf", "$ref"}),
        closed_by_default=True,
        required_in_properties=True,
        closed_with_properties=True,
        disjoint_pattern_properties=True,
        single_all_of=True,
        integer_multiple_of=True,
        raw_patterns=True,
        pattern_drops_length=True,
    ),
    # outlines-core ignores every numeric bound, maxProperties, oneOf overlap and min/maxItems beside prefixItems.
    "outlines": Policy(
        keywords=_COMMON,
        formats=frozenset({"email", "uuid"}),
        approximate_formats=frozenset({"date", "date-time"}),  # date-time: the offset is optional
        typed=True,
        single_type=True,
        exclusive=frozenset({"enum", "const", "anyOf", "$ref"}),
        closed_by_default=True,
        required_in_properties=True,
        raw_patterns=True,
        length_drops_pattern=True,
    ),
}


def _pointer(path: str, *tokens: str | int) -> str:
    for token in tokens:
        path += "/" + str(token).replace("~", "~0").replace("/", "~1")
    return path


def _resolve(root: object, ref: str) -> bool:
    """Whether ``ref`` is a local JSON-pointer reference that resolves to a schema inside ``root``."""
    if ref != "#" and not ref.startswith("#/"):
        return False
    node = root
    for raw in ref[2:].split("/") if ref != "#" else []:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    return isinstance(node, dict | bool)


def _declared_types(node: dict) -> list[object] | None:
    declared = node.get("type")
    return [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else None


def _json_type(value: object) -> set[str]:
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number", "integer"} if value.is_integer() else {"number"}
    return {{str: "string", list: "array", dict: "object", type(None): "null"}[type(value)]}


def _implied_type(node: dict, exclusive: str) -> bool:
    """``type`` beside enum/const is redundant when every listed value already has that type."""
    types = set(_declared_types(node) or [])
    values = [node["const"]] if exclusive == "const" else node["enum"] if exclusive == "enum" else None
    return isinstance(values, list) and all(_json_type(v) & types for v in values)


def _patterns_overlap(node: dict) -> bool:
    """Whether a name in ``properties`` may also match a ``patternProperties`` regex."""
    import re

    names = list(node.get("properties") or {})
    for pattern in node.get("patternProperties") or {}:
        try:
            compiled = re.compile(pattern)
        except re.error:
            return True
        if any(compiled.search(name) for name in names):
            return True
    return False


def _needs_u_escape(value: object) -> bool:
    """Whether a literal holds a character JSON can only write as ``\\uXXXX`` (any string, key included)."""
    if isinstance(value, str):
        return any((ch < " " and ch not in "\b\t\n\f\r") or ch == "\x7f" for ch in value)
    if isinstance(value, dict):
        return any(_needs_u_escape(k) or _needs_u_escape(v) for k, v in value.items())
    return isinstance(value, list) and any(_needs_u_escape(v) for v in value)


def _pattern_ok(pattern: str, policy: Policy) -> bool:
    translated = translate(pattern)
    return translated is not None and not (policy.raw_patterns and takes_json_escaped(translated))


def _keyword_ok(kw: str, node: dict, path: str, root: object, policy: Policy, allow_approx: bool) -> bool:
    """Whether ``policy``'s engine enforces ``node[kw]`` here (``kw`` is in its keyword list)."""
    value = node[kw]
    malformed = (kw in SCHEMA_MAPS and not isinstance(value, dict)) or (
        kw in (*SCHEMA_LISTS, "enum", "required") and not isinstance(value, list))
    if malformed:
        return False  # engines would crash on it or skip it
    types = set(_declared_types(node) or [])
    if "integer" in types:
        types.add("number")
    wanted = KEYWORD_TYPE.get(kw)
    if policy.typed and wanted and (wanted not in types or (policy.single_type and not isinstance(node["type"], str))):
        return False
    if kw == "type":
        return bool(types) and types <= JSON_TYPES
    if kw == "$ref":
        return isinstance(value, str) and _resolve(root, value)
    if kw == "pattern" and not (isinstance(value, str) and _pattern_ok(value, policy)):
        return False
    if kw == "patternProperties" and not all(_pattern_ok(p, policy) for p in value):
        return False
    if kw in ("pattern", "format") and policy.length_drops_pattern and ("minLength" in node or "maxLength" in node):
        return False
    if kw in ("minLength", "maxLength") and policy.pattern_drops_length and ("pattern" in node or "format" in node):
        return False
    if kw in ("const", "enum") and policy.plain_literals and _needs_u_escape(value):
        return False
    if kw == "format":
        return value in policy.formats or (allow_approx and value in policy.approximate_formats)
    if kw == "allOf" and policy.single_all_of:
        return isinstance(value, list) and len(value) == 1
    if kw == "multipleOf" and policy.integer_multiple_of:
        return node.get("type") == "integer" and isinstance(value, int) and not isinstance(value, bool)
    if kw == "required" and policy.required_in_properties:
        return isinstance(value, list) and set(value) <= set(node.get("properties") or {})
    if kw == "additionalProperties" and policy.closed_with_properties and value is not False:
        return not node.get("properties") and not node.get("patternProperties")
    if kw == "patternProperties" and policy.disjoint_pattern_properties:
        return not _patterns_overlap(node)
    if kw == "minProperties":  # duplicate keys reach the count while the parsed object has fewer
        extra = node.get("additionalProperties", not policy.closed_by_default)
        return extra is False and not node.get("patternProperties")
    return True


def _check_node(node: dict, path: str, root: object, policy: Policy, allow_approx: bool) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for kw in node:
        if kw in ANNOTATIONS or (kw == "$id" and path == "#"):
            continue  # a nested $id is refused: it changes what $ref resolves to
        if kw not in policy.keywords or not _keyword_ok(kw, node, path, root, policy, allow_approx):
            found.append((path, kw))
    constraints = [kw for kw in node if kw not in ANNOTATIONS and kw != "$id"]
    exclusive = [kw for kw in constraints if kw in policy.exclusive]
    if exclusive:
        kept = exclusive[0]
        for kw in constraints:
            if kw != kept and not (kw == "type" and _implied_type(node, kept)):
                found.append((path, kw))
    return found


def _walk(node: object, path: str, root: object, policy: Policy, allow_approx: bool) -> list[tuple[str, str]]:
    """Check ``node`` and, below keywords that passed, its subschemas (a refused subtree says enough)."""
    if isinstance(node, bool):
        return []
    if not isinstance(node, dict):
        return [(path, "(not a schema)")]
    found = _check_node(node, path, root, policy, allow_approx)
    refused = {kw for at, kw in found if at == path}
    children: list[tuple[object, str]] = []
    for kw in SCHEMA_MAPS:
        if kw not in refused and isinstance(node.get(kw), dict):
            children += [(sub, _pointer(path, kw, name)) for name, sub in node[kw].items()]
    for kw in SCHEMA_LISTS:
        if kw not in refused and isinstance(node.get(kw), list):
            children += [(sub, _pointer(path, kw, index)) for index, sub in enumerate(node[kw])]
    children += [(node[kw], _pointer(path, kw)) for kw in SCHEMA_SINGLES if kw in node and kw not in refused]
    for sub, sub_path in children:
        found += _walk(sub, sub_path, root, policy, allow_approx)
    return found


def unsupported_keywords(
    schema: object, backend: str, *, allow_approximate_formats: bool = False
) -> list[tuple[str, str]]:
    """(JSON pointer as a URI fragment, keyword) for each keyword ``backend`` would not enforce.

    A sibling that the engine drops is reported under its own name (``type`` beside ``anyOf``
    for xgrammar, say). ``allow_approximate_formats`` accepts formats an engine checks except
    for calendar details (2021-02-29 passes as a date); off by default, since such output can
    be invalid. The walk recurses: bound untrusted input with ``check_limits`` first.
    """
    found = _walk(schema, "#", schema, POLICIES[backend], allow_approximate_formats)
    return list(dict.fromkeys(found))


def json_depth(value: object) -> int:
    """Nesting depth of containers, computed without recursion (the input may be hostile)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def check_limits(schema: object, *, max_depth: int = DEFAULT_MAX_DEPTH, max_bytes: int = DEFAULT_MAX_BYTES,
                 backend: str | None = None) -> None:
    """Raise ConstraintError naming the limit when the schema is too deeply nested or too large.

    Depth is checked first and without recursion, so the size check (which serializes) and the
    keyword walk (which recurses) only ever see bounded input.
    """
    depth = json_depth(schema)
    if depth > max_depth:
        raise ConstraintError(f"the schema nests {depth} levels deep; the limit (max_depth) is {max_depth}", backend)
    size = len(canonical_json(schema).encode("utf-8"))
    if size > max_bytes:
        raise ConstraintError(f"the schema is {size} bytes; the limit (max_bytes) is {max_bytes}", backend)


def translate_patterns(node: object) -> object:
    """A copy of the schema with every ``pattern`` and patternProperties key in ECMA terms.

    Only subschema positions are rewritten (never const/enum/default data); key order is kept.
    Call after the guard: an untranslatable pattern is left as it was.
    """
    if not isinstance(node, dict):
        return node
    out: dict = {}
    for kw, value in node.items():
        if kw == "pattern" and isinstance(value, str):
            out[kw] = translate(value) or value
        elif kw == "patternProperties" and isinstance(value, dict):
            out[kw] = {translate(p) or p: translate_patterns(sub) for p, sub in value.items()}
        elif kw in SCHEMA_MAPS and isinstance(value, dict):
            out[kw] = {name: translate_patterns(sub) for name, sub in value.items()}
        elif kw in SCHEMA_LISTS and isinstance(value, list):
            out[kw] = [translate_patterns(sub) for sub in value]
        elif kw in SCHEMA_SINGLES:
            out[kw] = translate_patterns(value)
        else:
            out[kw] = value
    return out


def check_schema(schema: object, backend: str, *, max_depth: int = DEFAULT_MAX_DEPTH,
                 max_bytes: int = DEFAULT_MAX_BYTES, allow_approximate_formats: bool = False) -> object:
    """Check limits (cheap, and they bound the walk) and the guard; return the schema to compile.

    Raises ConstraintError on the first problem: ``unsupported keyword 'kw' at #/path``.
    """
    check_limits(schema, max_depth=max_depth, max_bytes=max_bytes, backend=backend)
    if not isinstance(schema, dict | bool):
        raise ConstraintError("a JSON schema must be an object or a boolean", backend)
    problems = unsupported_keywords(schema, backend, allow_approximate_formats=allow_approximate_formats)
    if problems:
        path, keyword = problems[0]
        raise ConstraintError(f"unsupported keyword '{keyword}' at {path}", backend)
    return translate_patterns(schema)
