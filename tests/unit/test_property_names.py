"""``propertyNames`` folded into the keys an object lists (json_schema/property_names.py): exact, judged by the
validator on many objects, and then served by the engines exactly (``constraint.exact``) instead of on the fallback."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from proctor.constraints.json_schema import prepare_schema
from proctor.constraints.json_schema.pattern_text import finite_names
from proctor.constraints.json_schema.property_names import fold_finite_patterns, fold_property_names
from proctor.constraints.json_schema.support import unsupported_keywords

NAMES = ["a", "b", "ab", "abcd", "x1", "k", "", "long name", "\n"]
VALUES: list[Any] = [1, "s", None, {"a": 1}, 2.5]
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "propertyNames": {"enum": ["a", "b", "ab"]}, "additionalProperties": {"type": "integer"}},
    {"type": "object", "propertyNames": {"const": "a"}},
    {"type": "object", "propertyNames": {"enum": ["a", "abcd", 3], "maxLength": 2}, "required": ["a"]},
    {"type": "object", "propertyNames": {"enum": ["a", "x1", "k"]}, "properties": {"a": {"type": "integer"}},
     "patternProperties": {"^x": {"type": "string"}, "1$": {"minLength": 1}}, "additionalProperties": False},
    {"type": "object", "propertyNames": {"type": "string", "pattern": "^[a-z]+$"},
     "additionalProperties": {"type": "integer"}},
    {"type": "object", "propertyNames": {"maxLength": 2}},
    {"type": "object", "propertyNames": {"minLength": 1, "maxLength": 4}, "minProperties": 2},
    {"type": "object", "propertyNames": False},
    {"propertyNames": True, "properties": {"a": {"type": "integer"}}},
]


def objects() -> list[dict[str, Any]]:
    found = [{}]
    for size in (1, 2, 3):
        for names in itertools.combinations(NAMES, size):
            for start in range(2):
                found.append({name: VALUES[(start + i) % len(VALUES)] for i, name in enumerate(names)})
    return found


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_fold_keeps_meaning_exactly(schema: dict[str, Any]) -> None:
    folded = fold_property_names(schema)
    assert "propertyNames" not in folded
    before, after = Draft202012Validator(schema), Draft202012Validator(folded)
    instances = [*objects(), "not an object", 3]
    assert any(before.is_valid(instance) for instance in instances)
    for instance in instances:
        assert before.is_valid(instance) == after.is_valid(instance), (folded, instance)


@pytest.mark.parametrize("schema", [
    {"type": "object", "propertyNames": {"pattern": "^a", "maxLength": 3}},  # both: no one pattern says it
    {"type": "object", "propertyNames": {"pattern": "^a"}, "properties": {"b": {}}},  # not a map
    {"type": "object", "propertyNames": {"enum": ["a"]}, "required": ["b"]},  # unsatisfiable: left for the validator
    {"type": "object", "propertyNames": {"format": "email"}},
])
def test_what_cannot_be_folded_exactly_is_left_as_written(schema: dict[str, Any]) -> None:
    assert fold_property_names(schema) == schema


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_the_issue_shapes_need_nothing_the_engines_do_not_enforce(backend: str) -> None:
    shapes = [SCHEMAS[0], SCHEMAS[4], {"type": "object", "minProperties": 5},
              {"type": "object", "patternProperties": {"^k[0-9]+$": {"type": "integer"}}, "minProperties": 4,
               "additionalProperties": False}]
    for shape in shapes:
        assert unsupported_keywords(shape, backend) == [], shape
        assert "propertyNames" not in str(prepare_schema(shape))


FINITE: list[dict[str, Any]] = [
    {"type": "object", "patternProperties": {"^(a|b)$": {"type": "integer"}}, "additionalProperties": False},
    {"type": "object", "patternProperties": {"^(a|ab)$": {"type": "integer"}, "^a": {"minimum": 1}},
     "additionalProperties": False},  # "^a" matches infinitely many names: left as written
    {"type": "object", "properties": {"k": {"type": "string"}}, "patternProperties": {"^x[0-1]?$": {"type": "integer"}},
     "additionalProperties": False, "required": ["k"]},
    {"type": "object", "propertyNames": {"pattern": "^(a|b|x1)$"}, "additionalProperties": {"type": "integer"}},
]


@pytest.mark.parametrize(("pattern", "names"), [
    ("^(a|b)$", ["a", "b"]), ("^k[0-9]$", [f"k{d}" for d in range(10)]), ("^ab?c$", ["abc", "ac"]),
    ("^(?:red|green)$", ["green", "red"]), ("^x+$", None), ("^a", None), ("^[a-z]{2}$", None),  # 676 > 256
    ("^.$", None), ("^(a|b)$|^c$", None),  # anchors inside an alternative: not read (left as written)
])
def test_the_names_a_pattern_admits(pattern: str, names: list[str] | None) -> None:
    assert finite_names(pattern, 256) == names


@pytest.mark.parametrize("schema", FINITE)
def test_a_few_pattern_names_are_listed_exactly(schema: dict[str, Any]) -> None:
    """The names each pattern admits become listed properties (so the engines offer each once, no dead end after
    the last): an object is valid after iff it was before."""
    folded = fold_finite_patterns(fold_property_names(schema))
    if "^a" in schema.get("patternProperties", {}):
        assert folded == schema
        return
    assert "patternProperties" not in folded and folded["additionalProperties"] is False
    before, after = Draft202012Validator(schema), Draft202012Validator(folded)
    names = ["a", "b", "ab", "x", "x0", "x1", "x2", "k", "c"]
    instances: list[Any] = [{}, "not an object"]
    for size in (1, 2, 3):
        for chosen in itertools.combinations(names, size):
            instances += [dict.fromkeys(chosen, 1), dict.fromkeys(chosen, "s"),
                          {**dict.fromkeys(chosen, 2), "k": "v"}]
    assert any(before.is_valid(instance) for instance in instances)
    for instance in instances:
        assert before.is_valid(instance) == after.is_valid(instance), (folded, instance)
