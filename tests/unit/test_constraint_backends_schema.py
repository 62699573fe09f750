"""The JSON Schema soundness guard and the ECMA pattern translation (no engine needed).

Each row of the table is a finding from running the engines: the keyword is flagged where the
engine let invalid output through, and not flagged where it enforced it.
"""

from __future__ import annotations

import json

import pytest

from proctor.constraints.errors import ConstraintError
from proctor.constraints.json_schema.ecma_regex import translate
from proctor.constraints.json_schema.support import check_schema, unsupported_keywords

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
ALL = ("xgrammar", "llguidance", "outlines")

# (schema, {backend: expected [(path, keyword)]}); backends left out expect [].
TABLE = [
    (OBJ, {}),
    ({"type": "string", "enum": ["a", "b"]}, {}),  # type implied by the values: fine everywhere
    ({"type": "integer", "enum": [1, "a"]}, {"xgrammar": [("#", "type")], "outlines": [("#", "type")]}),
    ({"type": "integer", "minimum": 1, "maximum": 9}, {"outlines": [("#", "minimum"), ("#", "maximum")]}),
    ({"minLength": 2}, {"xgrammar": [("#", "minLength")], "outlines": [("#", "minLength")]}),
    ({"type": ["string", "null"], "maxLength": 2}, {"outlines": [("#", "maxLength")]}),
    ({"type": "number", "multipleOf": 0.5}, {"xgrammar": [("#", "multipleOf")], "outlines": [("#", "multipleOf")]}),
    ({"type": "integer", "multipleOf": 3}, {"outlines": [("#", "multipleOf")]}),
    ({"type": "array", "uniqueItems": True}, {b: [("#", "uniqueItems")] for b in ALL}),
    ({"type": "array", "contains": {"type": "integer"}}, {b: [("#", "contains")] for b in ALL}),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 2}, {"outlines": [("#", "prefixItems")]}),
    ({"type": "object", "required": ["a"]}, {"xgrammar": [("#", "required")], "outlines": [("#", "required")]}),
    ({**OBJ, "additionalProperties": {"type": "string"}}, {"xgrammar": [("#", "additionalProperties")]}),
    ({"type": "object", "additionalProperties": {"type": "string"}}, {}),
    # {"a":1,"a":2} reached 2 keys while it held one; the key memory bans a key written twice (issue 56), so the
    # engines' count holds (outlines does not count)
    ({"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}},
     {"outlines": [("#", "minProperties")]}),
    ({"type": "object", "minProperties": 4, "patternProperties": {"^k": {"type": "integer"}},
      "additionalProperties": False}, {"outlines": [("#", "minProperties"), ("#", "patternProperties")]}),
    # propertyNames folded into the keys listed (json_schema/property_names.py); outlines takes no patternProperties
    ({"type": "object", "propertyNames": {"enum": ["a", "b"]}, "additionalProperties": {"type": "integer"}}, {}),
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}, {"outlines": [("#", "patternProperties")]}),
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 3}},
     {b: [("#", "propertyNames")] for b in ALL}),  # a pattern and a length: not folded
    ({"type": "object", "minProperties": 1, "additionalProperties": {"type": "integer"}},
     {"outlines": [("#", "minProperties")]}),  # one key is one key, duplicated or not
    ({"type": "object", "properties": {"foo": {"type": "integer"}}, "patternProperties": {"f.o": {"type": "integer"}}},
     {"xgrammar": [("#", "patternProperties")], "outlines": [("#", "patternProperties")]}),
    # dependentRequired is rewritten to an anyOf (exact), which llguidance enforces; the others
    # drop siblings of anyOf or ignore required names outside properties.
    ({"type": "object", "dependentRequired": {"a": ["b"]}},
     {b: [("#", "type"), ("#/anyOf/0", "properties"), ("#/anyOf/1", "required")] for b in ("xgrammar", "outlines")}),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, {}),  # disjoint: rewritten to anyOf
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, {b: [("#", "oneOf")] for b in ("xgrammar", "outlines")}),
    ({"allOf": [{"type": "integer"}, {"type": "integer", "minimum": 2}]},
     {"xgrammar": [("#", "type")], "outlines": [("#", "allOf")]}),
    ({"type": "string", "anyOf": [{"type": "string"}]}, {"xgrammar": [("#", "type")], "outlines": [("#", "type")]}),
    ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 3},
     {"xgrammar": [("#", "minimum")], "outlines": [("#", "minimum")]}),
    ({"$ref": "http://example.com/s.json"}, {b: [("#", "$ref")] for b in ALL}),
    ({"type": "integer", "not": {"const": 3}}, {b: [("#", "not")] for b in ALL}),
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
     {b: [("#", "if"), ("#", "then")] for b in ALL}),
    ({"type": "string", "format": "date"}, {}),  # spelled out as an exact pattern (constraints/json_schema/formats.py)
    ({"type": "string", "format": "date", "pattern": "^2"}, {b: [("#", "format")] for b in ALL}),  # approximate
    ({"type": "string", "format": "uuid"}, {}),
    ({"type": "string", "format": "ipv6"}, {"xgrammar": [("#", "format")], "outlines": [("#", "format")]}),
    ({"type": "string", "format": "no-such-format"}, {}),  # not a format the spec defines: an annotation
    ({"type": "object", "x-kubernetes-group-version-kind": [{"kind": "Pod"}], "_format": "x", "readonly": True,
      "preferredOrder": ["a"], "id": "v1", "properties": {"a": {"type": "string", "name": "a"}}}, {}),
    ({"type": "string", "pattern": "(a)\\1"}, {b: [("#", "pattern")] for b in ALL}),
    ({"const": "a\u0000b"}, {"llguidance": [("#", "const")]}),
    # Patterns are matched against raw JSON text by xgrammar and outlines: '"', '\\' or a control character
    # in what an atom takes lets a string close early or hold an unescaped character (maskbench).
    *[({"type": "string", "pattern": p}, {"xgrammar": [("#", "pattern")], "outlines": [("#", "pattern")]})
      for p in ("^a.+$", "\\S+", "\\W", "\\D", "[^a]", "\\s", "[ -~]+", '"', "\\\\", "\\x22", "\\u005c", "\\p{L}",
                "a\tb")],
    ({"type": "string", "pattern": "^[A-Za-z0-9_.-]+@[a-z]+\\.(com|org)$"}, {}),
    ({"type": "string", "pattern": "^\\d{3}-\\w+\\u00e9$"}, {}),
    ({"type": "object", "patternProperties": {"^x-.*$": {"type": "string"}}, "additionalProperties": False},
     {"xgrammar": [("#", "patternProperties")], "outlines": [("#", "patternProperties")]}),
    ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
     {"xgrammar": [("#", "maxLength")], "outlines": [("#", "pattern")]}),
    ({"type": "string", "format": "email", "minLength": 3, "maxLength": 8},
     {"xgrammar": [("#", "minLength"), ("#", "maxLength")], "outlines": [("#", "format")]}),
    ({"type": "string", "pattern": "^[a-z]+$"}, {}),
    ({"type": "object", "x-guidance": {"lenient": True}}, {}),  # our llguidance options are overrides; stripped
    ({"type": "object", "properties": {"a": {"$id": "other.json", "type": "integer"}}}, {}),  # no $ref to re-base
    ({"type": "object", "properties": {"a": {"$id": "other.json", "$defs": {"n": {"type": "integer"}},
                                             "$ref": "#/properties/a/$defs/n"}}},
     {b: [("#/properties/a", "$id")] for b in ALL}),
    ({"$id": "root.json", "title": "t", "description": "d", "$comment": "c", "examples": [1], "default": 1,
      "deprecated": False, "readOnly": True, "$schema": "https://json-schema.org/draft/2020-12/schema",
      "type": "integer"}, {}),
    ({"type": "array", "items": [{"type": "integer"}]}, {b: [("#/items", "(not a schema)")] for b in ALL}),
]


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize(("schema", "expected"), TABLE, ids=[json.dumps(s)[:60] for s, _ in TABLE])
def test_guard_flags_what_the_engine_does_not_enforce(schema: object, expected: dict, backend: str) -> None:
    assert unsupported_keywords(schema, backend) == expected.get(backend, [])


def test_nested_paths_are_json_pointers() -> None:
    items = {"type": "integer", "not": {"multipleOf": 2}}
    schema = {"type": "object", "properties": {"a/b": {"type": "array", "items": items}},
              "$defs": {"x~y": {"type": "string", "format": "hostname"}}}
    assert unsupported_keywords(schema, "llguidance") == [
        ("#/$defs/x~0y", "format"), ("#/properties/a~1b/items", "not")]


def test_calendar_formats_need_the_opt_in() -> None:
    schema = {"type": "string", "format": "date-time", "pattern": "^2"}  # no exact pattern can stand in
    assert unsupported_keywords(schema, "llguidance") == [("#", "format")]
    assert unsupported_keywords(schema, "llguidance", allow_approximate_formats=True) == []


def test_outlines_date_time_is_approximate() -> None:
    schema = {"type": "string", "format": "date-time", "pattern": "^2"}  # outlines makes the offset optional
    assert unsupported_keywords(schema, "outlines") == [("#", "format")]
    assert unsupported_keywords(schema, "outlines", allow_approximate_formats=True) == []


def test_check_schema_names_keyword_and_path_and_translates_patterns() -> None:
    with pytest.raises(ConstraintError) as info:
        check_schema({"type": "object", "properties": {"p": {"type": "integer", "not": {"multipleOf": 2}}}}, "xgrammar")
    assert info.value.reason == "unsupported keyword 'not' at #/properties/p" and info.value.backend == "xgrammar"
    schema = {"type": "object", "properties": {"z": {"type": "string", "pattern": "^\\d+$"}, "a": {"const": "."}}}
    checked = check_schema(schema, "llguidance")
    assert list(checked["properties"]) == ["z", "a"]  # author's order kept
    assert checked["properties"]["z"]["pattern"] == "^[0-9]+$" and checked["properties"]["a"]["const"] == "."
    assert schema["properties"]["z"]["pattern"] == "^\\d+$"  # the input is not modified


@pytest.mark.parametrize(("pattern", "expected"), [
    ("^\\d{4}-\\d{2}$", "^[0-9]{4}-[0-9]{2}$"),
    ("a.c", "a[^\\n\\r\u2028\u2029]c"),
    ("[\\w.-]+", "[A-Za-z0-9_.-]+"),
    ("\\W\\D", "[^A-Za-z0-9_][^0-9]"),
    ("[\\b]", "[\\x08]"),
    ("\\.\\$\\u0041[^a\\]]", "\\.\\$\\u0041[^a\\]]"),
    ("(?:ab)+(?=c)", "(?:ab)+(?=c)"),
])
def test_ecma_shorthands_are_spelled_out(pattern: str, expected: str) -> None:
    assert translate(pattern) == expected


def test_whitespace_classes_follow_ecma() -> None:
    space = translate("\\s")
    assert space is not None and "\ufeff" in space and "\u00a0" in space and space.startswith("[")
    assert translate("\\S") == "[^" + space[1:]


@pytest.mark.parametrize("pattern", ["(a)\\1", "\\k<x>", "a\\b", "\\Bx", "[\\D]", "[\\S]", "[]", "[^]", "[a[b]]",
                                     "[a&&b]", "(?i)a", "\\cA", "abc\\"])
def test_untranslatable_patterns_are_refused(pattern: str) -> None:
    assert translate(pattern) is None


def test_dangling_refs_and_cycles_without_base_case_are_refused() -> None:
    with pytest.raises(ConstraintError, match="does not exist"):
        check_schema({"$ref": "#/$defs/missing"}, "llguidance")
    cycle = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    with pytest.raises(ConstraintError, match="no finite value"):
        check_schema(cycle, "llguidance")
    forced = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    with pytest.raises(ConstraintError, match="no finite value"):
        check_schema(forced, "llguidance")
    # A recursive schema with a way out is fine: null ends the chain, or the property is optional.
    chain = {"type": ["object", "null"], "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    check_schema(chain, "llguidance")
    check_schema({"type": "object", "properties": {"next": {"$ref": "#"}}}, "llguidance")


def test_every_problem_is_named_with_its_pointer() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True},
                                               "b": {"not": {"multipleOf": 2}}},
              "propertyNames": {"maxLength": 3}}
    with pytest.raises(ConstraintError) as info:
        check_schema(schema, "llguidance")
    reason = info.value.reason
    for expected in ("'propertyNames' at #", "'uniqueItems' at #/properties/a", "'not' at #/properties/b"):
        assert expected in reason
    many = {"type": "object", "properties": {f"p{i}": {"type": "array", "uniqueItems": True} for i in range(30)}}
    with pytest.raises(ConstraintError, match="and 18 more"):
        check_schema(many, "llguidance")
