"""The JSON Schema vocabularies in one table: which keywords exist, which assert, where subschemas sit.

The soundness guard is a deny-list over these names: a keyword that no known vocabulary
(draft-04 through 2020-12) defines is an annotation, exactly as the specification and the
``jsonschema`` validator treat it (``x-kubernetes-*``, ``_format``, ``readonly``...), so it can
neither be violated nor refused. Only the *assertions and applicators* below can make an
instance invalid; an engine that does not enforce one of them must refuse it or hand it to the
validated fallback.
"""

from __future__ import annotations

from typing import Any

# Keywords of the known vocabularies that never make an instance invalid. ``$id`` is here for
# the root only (a nested one re-bases ``$ref``: the guard looks at it separately); ``$anchor``
# and ``$dynamicAnchor`` name a place, and a ``$ref`` to an anchor is refused by ref resolution.
ANNOTATIONS = frozenset({
    "$schema", "$id", "$anchor", "$dynamicAnchor", "$vocabulary", "$comment", "$defs", "definitions",
    "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
    "contentMediaType", "contentEncoding", "contentSchema",
})

# Every keyword that can make an instance invalid (2020-12 names; draft-04..07 and 2019-09
# spellings are normalised to these by ``dialect`` before anyone looks).
ASSERTIONS = frozenset({
    # core
    "$ref", "$dynamicRef", "$recursiveRef", "$recursiveAnchor",
    # applicators
    "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "prefixItems", "items",
    "contains", "properties", "patternProperties", "additionalProperties", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties",
    # validation
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains",
    "maxProperties", "minProperties", "required", "dependentRequired",
    # format (asserted by the server's validator for the formats in FORMATS)
    "format",
})

# The formats the 2020-12 specification defines (all asserted by the server's validator, which
# has the checkers installed). Any other ``format`` value is an annotation: it constrains nothing.
FORMATS = frozenset({
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
})

# Keywords whose constraint applies only to one instance type (they pass any other type).
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

# Where subschemas sit (2020-12 terms). NEGATIVE positions flip validity (a subschema made
# looser there makes the whole stricter), so relaxing never reaches into them.
SCHEMA_MAPS = ("$defs", "definitions", "properties", "patternProperties", "dependentSchemas")
SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
SCHEMA_SINGLES = ("items", "additionalProperties", "contains", "not", "if", "then", "else", "propertyNames",
                  "unevaluatedItems", "unevaluatedProperties")
NEGATIVE = frozenset({"not", "if"})
# Keywords whose value is data, never a schema (a "$ref" inside them is not a reference).
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def subschemas(node: dict[str, Any]) -> list[tuple[tuple[str | int, ...], object]]:
    """(relative JSON-pointer tokens, subschema) for every subschema directly below ``node``."""
    out: list[tuple[tuple[str | int, ...], object]] = []
    for kw in SCHEMA_MAPS:
        if isinstance(node.get(kw), dict):
            out += [((kw, name), sub) for name, sub in node[kw].items()]
    for kw in SCHEMA_LISTS:
        if isinstance(node.get(kw), list):
            out += [((kw, index), sub) for index, sub in enumerate(node[kw])]
    out += [((kw,), node[kw]) for kw in SCHEMA_SINGLES if kw in node]
    return out


def pointer(path: str, *tokens: str | int) -> str:
    """Extend a JSON pointer written as a URI fragment (``#/properties/a~1b``)."""
    for token in tokens:
        path += "/" + str(token).replace("~", "~0").replace("/", "~1")
    return path


def pointer_tokens(path: str) -> list[str]:
    """The unescaped tokens of a ``#/...`` pointer."""
    if path in ("#", ""):
        return []
    return [raw.replace("~1", "/").replace("~0", "~") for raw in path.lstrip("#").lstrip("/").split("/")]


def resolve_pointer(root: object, ref: str) -> object | None:
    """The node a local ``#/...`` reference points to, or None (anchors and remote refs: None)."""
    if ref != "#" and not ref.startswith("#/"):
        return None
    node = root
    for token in pointer_tokens(ref):
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node if isinstance(node, dict | bool) else None
