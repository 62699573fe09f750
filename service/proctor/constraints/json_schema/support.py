"""Soundness guard for JSON Schemas: refuse only what an engine would silently not enforce.

A deny-list over the known vocabularies (``keywords``): keywords no draft defines are
annotations — the specification and the server's validator ignore them, so refusing them
protects nothing — and so are ``format`` values the specification does not define. For each
engine, ``Policy`` lists the assertion keywords it enforces and the conditions under which it
does (found by running the JSON Schema Test Suite, MaskBench and targeted probes through each
engine with the real tokenizer: a keyword counts as enforced only where no invalid instance got
through). Any other assertion keyword is a problem, reported with its JSON pointer; all of
them are named at once (bounded), so a caller can fix a schema in one round trip.

Before the guard looks, the schema is read by its own draft and restated in 2020-12 terms
(``dialect``), rewritten exactly where that helps (``rewrite``), and its local
references checked. ``relax`` builds the documented superset for the validated fallback: the
problems dropped (``oneOf`` read as ``anyOf``), only ever in positive positions
(``relax``).

Every JSON-schema matcher is served under the key memory (constraints/key_memory/: no key written twice in one
object), so a count of members is a count of distinct keys: ``minProperties`` and ``maxProperties`` hold wherever
the engine counts them. ``propertyNames`` is folded into the keys an object lists before the guard looks
(``property_names``, through ``rewrite``) where that is exact; elsewhere it is a problem like any other.

Known gaps that no keyword list can express are documented in the adapters' module docstrings.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from proctor.constraints.engines import ENGINES, LLGUIDANCE, OUTLINES, XGRAMMAR
from proctor.constraints.errors import ConstraintError
from proctor.constraints.json_schema.dialect import DRAFT2020_URI, normalize
from proctor.constraints.json_schema.ecma_regex import takes_json_escaped, translate
from proctor.constraints.json_schema.formats import FORMAT_PATTERNS, exact_pattern
from proctor.constraints.json_schema.keywords import (
    ASSERTIONS,
    FORMATS,
    JSON_TYPES,
    KEYWORD_TYPE,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    TYPE_KEYWORDS,
    pointer,
    pointer_tokens,
    resolve_pointer,
    subschemas,
)
from proctor.constraints.json_schema.property_names import fold_property_names
from proctor.constraints.json_schema.refs import check_refs
from proctor.constraints.json_schema.rewrite import rewrite
from proctor.constraints.json_schema.walk import canonical_pointer, contains_ref, reachable

MAX_NAMED_PROBLEMS = 12  # problems named in one error message (a count of the rest follows)
Problem = tuple[str, str]  # (JSON pointer as a URI fragment, keyword)


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
_CALENDAR = frozenset(FORMAT_PATTERNS)

POLICIES: dict[str, Policy] = {
    # llguidance refuses what it does not implement (with lenient off) but ignores unknown keys.
    LLGUIDANCE: Policy(
        keywords=_COMMON | _NUMBER | {"prefixItems", "oneOf", "allOf", "patternProperties", "minProperties",
                                      "maxProperties"},
        formats=frozenset({"duration", "email", "ipv4", "ipv6", "uri", "uuid"}),
        approximate_formats=_CALENDAR,
        plain_literals=True,
    ),
    # xgrammar reads an untyped node as any JSON, drops siblings of enum/const/anyOf/allOf/$ref,
    # reads allOf as its first member, ignores required names outside properties and float multipleOf.
    XGRAMMAR: Policy(
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
    OUTLINES: Policy(
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
assert set(POLICIES) == set(ENGINES), "every engine has its soundness policy (engines.py)"


def _declared_types(node: dict[str, Any]) -> list[object] | None:
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


def _implied_type(node: dict[str, Any], exclusive: str) -> bool:
    """``type`` beside enum/const is redundant when every listed value already has that type."""
    types = set(_declared_types(node) or [])
    values = [node["const"]] if exclusive == "const" else node["enum"] if exclusive == "enum" else None
    return isinstance(values, list) and all(_json_type(v) & types for v in values)


def _patterns_overlap(node: dict[str, Any]) -> bool:
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


def _is_annotation(kw: str, node: dict[str, Any]) -> bool:
    """Unknown keywords, and ``format`` values the specification does not define, constrain nothing."""
    return kw not in ASSERTIONS or (kw == "format" and node[kw] not in FORMATS)


def _keyword_ok(kw: str, node: dict[str, Any], root: object, policy: Policy, allow_approx: bool) -> bool:
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
        return isinstance(value, str) and resolve_pointer(root, value) is not None
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
    if kw == "format":  # a calendar format with its exact pattern beside it is that pattern (``formats``)
        return value in policy.formats or exact_pattern(node) or (allow_approx and value in policy.approximate_formats)
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
    # minProperties: an engine counts the members written, and a key written twice counted twice while the parsed
    # object held one less; the key memory (constraints/key_memory/) now bans a key written twice over every
    # engine's mask, so the engine's count is the object's (issue 56).
    return True


def _check_node(node: dict[str, Any], path: str, root: object, policy: Policy, allow_approx: bool) -> list[Problem]:
    found: list[Problem] = []
    for kw in node:
        if kw == "$id" and path != "#" and contains_ref(node):
            found.append((path, kw))  # it re-bases the $refs below it, which engines resolve from the root
        elif _is_annotation(kw, node):
            continue
        elif kw not in policy.keywords or not _keyword_ok(kw, node, root, policy, allow_approx):
            found.append((path, kw))
    constraints = [kw for kw in node if not _is_annotation(kw, node)]
    exclusive = [kw for kw in constraints if kw in policy.exclusive]
    if exclusive:
        kept = exclusive[0]
        for kw in constraints:
            if kw != kept and not (kw == "type" and _implied_type(node, kept)):
                found.append((path, kw))
    return found


def problems_for(schema: object, policy: Policy, *, allow_approximate_formats: bool = False) -> list[Problem]:
    """Every problem, walking subschemas and $ref targets (below a refused keyword: not looked into)."""
    found: list[Problem] = []
    seen: set[str] = set()
    stack: list[tuple[str, object]] = [("#", schema)]
    while stack:
        path, node = stack.pop()
        if path in seen:
            continue
        seen.add(path)
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            found.append((path, "(not a schema)"))
            continue
        here = _check_node(node, path, schema, policy, allow_approximate_formats)
        found += here
        refused = {kw for _, kw in here}
        children = [(pointer(path, *tokens), sub) for tokens, sub in subschemas(node) if tokens[0] not in refused]
        ref = node.get("$ref")
        if isinstance(ref, str) and "$ref" not in refused and resolve_pointer(schema, ref) is not None:
            children.append((canonical_pointer(ref), resolve_pointer(schema, ref)))
        stack.extend(reversed(children))
    return list(dict.fromkeys(found))


def prepare_schema(schema: object) -> object:
    """The schema in 2020-12 terms with the exact rewrites applied and its references checked."""
    normalized = normalize(schema)
    if isinstance(normalized, dict) and "$schema" in normalized:
        normalized = {**normalized, "$schema": DRAFT2020_URI}
    prepared = rewrite(normalized)
    check_refs(prepared)
    return prepared


def unsupported_keywords(schema: object, backend: str, *, allow_approximate_formats: bool = False) -> list[Problem]:
    """(JSON pointer as a URI fragment, keyword) for each keyword ``backend`` would not enforce.

    Pointers are into the prepared schema (``prepare_schema``): for a 2020-12 schema that is the
    schema as written. A sibling that the engine drops is reported under its own name (``type``
    beside ``anyOf`` for xgrammar, say). ``allow_approximate_formats`` accepts formats an engine
    checks except for calendar details (2021-02-29 passes as a date); off by default, since such
    output can be invalid — the validated fallback turns it on.
    """
    return problems_for(prepare_schema(schema), POLICIES[backend], allow_approximate_formats=allow_approximate_formats)


def remembered_keywords(schema: object) -> tuple[str, ...]:
    """``keyword at pointer`` for each keyword the key memory moved from the validated fallback to the mask (issue 56):
    ``propertyNames`` folded into the keys listed, ``minProperties`` above 1 beside keys not listed (the engines
    counted a key written twice). Pointers are into the schema in 2020-12 terms, before the rewrites."""
    found: list[str] = []
    for site in reachable(normalize(schema)):
        node = site.node
        if not isinstance(node, dict) or site.negative:
            continue
        if "propertyNames" in node and "propertyNames" not in fold_property_names(node):
            found.append(f"propertyNames at {site.path}")
        least = node.get("minProperties")
        open_keys = node.get("additionalProperties", True) is not False or bool(node.get("patternProperties"))
        if isinstance(least, int) and not isinstance(least, bool) and least > 1 and open_keys:
            found.append(f"minProperties at {site.path}")
    return tuple(found)


def describe(problems: list[Problem]) -> str:
    """``unsupported keywords: 'not' at #/x, 'uniqueItems' at #/y`` (bounded, with a count of the rest)."""
    named = [f"'{kw}' at {path}" for path, kw in problems[:MAX_NAMED_PROBLEMS]]
    more = len(problems) - len(named)
    word = "keyword" if len(problems) == 1 else "keywords"
    return f"unsupported {word} " + ", ".join(named) + (f" and {more} more" if more else "")


def finalize(schema: object) -> object:
    """A copy for the engine: every ``pattern`` and patternProperties key in ECMA terms, and
    ``format`` values the specification does not define removed (annotations engines would refuse).

    Subschemas are found by ``reachable`` (ref targets included), deepest first, so renaming a
    patternProperties key never moves a node still to be visited. Call after the guard: an
    untranslatable pattern is left as it was.
    """
    out = copy.deepcopy(schema)
    paths = sorted((site.path for site in reachable(out)), key=lambda p: -len(pointer_tokens(p)))
    for path in paths:
        node = resolve_pointer(out, path)
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("format"), str) and (node["format"] not in FORMATS or exact_pattern(node)):
            del node["format"]  # an annotation, or spelled out by the pattern beside it
        node.pop("x-guidance", None)  # llguidance reads it as options; ours are overrides, but leave no doubt
        if isinstance(node.get("pattern"), str):
            node["pattern"] = translate(node["pattern"]) or node["pattern"]
        if isinstance(node.get("patternProperties"), dict):
            node["patternProperties"] = {translate(p) or p: sub for p, sub in node["patternProperties"].items()}
    return out


def check_schema(schema: object, backend: str, *, allow_approximate_formats: bool = False) -> object:
    """Prepare the schema, run the guard, and return what the engine compiles.

    Raises ConstraintError naming every problem (bounded): ``unsupported keywords 'not' at #/x, ...``.
    Limits (depth, size) are the server's, checked once before a compile is sent anywhere.
    """
    if not isinstance(schema, dict | bool):
        raise ConstraintError("a JSON schema must be an object or a boolean", backend)
    prepared = prepare_schema(schema)
    problems = problems_for(prepared, POLICIES[backend], allow_approximate_formats=allow_approximate_formats)
    if problems:
        raise ConstraintError(describe(problems), backend)
    return finalize(prepared)


def format_uses(schema: object) -> list[tuple[str, str, bool, bool]]:
    """(pointer, format, known, spelled out) for every ``format`` in a prepared schema.

    known: the specification defines it; spelled out: an exact pattern stands beside it (``formats``).
    """
    return [(site.path, site.node["format"], site.node["format"] in FORMATS, exact_pattern(site.node))
            for site in reachable(schema) if isinstance(site.node, dict) and isinstance(site.node.get("format"), str)]

