"""Property tests of the schema transformations, judged by the validator on real instances.

* ``normalize`` (a draft-04/06/07 schema restated in 2020-12 terms) and ``rewrite`` (the exact
  rewrites) keep meaning exactly: every instance is valid before iff valid after.
* ``relax`` gives a superset: every instance valid before is valid after.

The instances are the JSON Schema Test Suite's (draft 7 and 2020-12) and a sample of MaskBench's,
plus hand-made cases aimed at each rewrite; the validator is ``jsonschema`` with the draft the
schema declares, as the server reads it (before), and 2020-12 (after).
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field

import pytest
from helpers.requirements import BENCHDATA, missing
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.exceptions import Unresolvable

from proctor.constraints.errors import ConstraintError
from proctor.constraints.json_schema import prepare_schema
from proctor.constraints.json_schema.dialect import draft_of, normalize
from proctor.constraints.json_schema.relaxed import relax
from proctor.constraints.json_schema.rewrite import disjoint, rewrite
from proctor.constraints.json_schema.validation import FORMAT_CHECKER, server_validator_class

SUITE = BENCHDATA / "json-schema-test-suite" / "tests"
MASKBENCH = BENCHDATA / "maskbench"
MASKBENCH_SAMPLE = 400  # files, spread over the splits by a hash of the name (the same ones every run)
REMOTE = ("refRemote", "remote", "dynamicRef", "vocabulary", "anchor", "id.json", "ref.json", "unknownKeyword",
          "defs.json", "infinite-loop-detection")


# What a comparison run must achieve. The corpora are fixed files, so the counts are the same every run:
# comparisons made (before vs after on one instance) draft7 820-824, draft2020-12 1119-1123, maskbench 1376;
# instances the validator cannot judge: 5 (draft2020-12: \p{...} patterns Python's re does not compile), else
# 0; schemas refused: 4 (relax of the suites: allOf/anyOf/oneOf of false, no finite value), else 0. The floors
# and ceilings leave room for a newer corpus, not for a transformation or validator that stopped comparing.
MIN_COMPARISONS = {"draft7": 750, "draft2020-12": 1000, "maskbench": 1250}
MAX_UNJUDGED = 10
MAX_REFUSED = 10
# Why the validator may be unable to judge an instance: a pattern Python's re does not compile (ECMA-262
# property escapes), a reference it cannot resolve (no remote registry). Anything else is a failure.
UNJUDGEABLE = (re.error, Unresolvable)


def _valid(cls: type, schema: object, instance: object, unjudged: Counter[str]) -> bool | None:
    """The verdict, or None (counted in ``unjudged`` by reason) when the validator cannot evaluate the schema."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return bool(cls(schema, registry=Registry(), format_checker=FORMAT_CHECKER).is_valid(instance))
    except UNJUDGEABLE as exc:
        unjudged[f"{type(exc).__name__}: {exc}"[:100]] += 1
        return None


def suite_cases(draft: str) -> list[tuple[str, object, list[object]]]:
    root = SUITE / draft
    if not root.is_dir():
        missing(f"the JSON Schema Test Suite is not at {root}")
    cases = []
    for path in sorted(root.glob("*.json")):
        if any(marker in path.name for marker in REMOTE):
            continue
        for group in json.loads(path.read_text(encoding="utf-8")):
            schema = group["schema"]
            if draft == "draft7" and isinstance(schema, dict):
                schema = {"$schema": "http://json-schema.org/draft-07/schema#", **schema}
            cases.append((f"{path.name}: {group['description']}", schema, [t["data"] for t in group["tests"]]))
    return cases


def maskbench_cases() -> list[tuple[str, object, list[object]]]:
    if not MASKBENCH.is_dir():
        missing(f"MaskBench is not at {MASKBENCH}")
    paths = sorted(MASKBENCH.glob("*.json"), key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())
    cases = []
    for path in paths[:MASKBENCH_SAMPLE]:
        item = json.loads(path.read_text(encoding="utf-8"))
        cases.append((path.name, item["schema"], [t["data"] for t in item["tests"]]))
    return cases


def _transformed(schema: object, how: str) -> object:
    if how == "normalize":
        return normalize(schema)
    if how == "rewrite":
        return rewrite(normalize(schema))
    return relax(schema, "llguidance").schema


@dataclass
class Comparison:
    """What one run over a corpus did: the comparisons made, and everything it did not compare, by reason."""

    compared: int = 0
    bad: list[str] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    unjudged: Counter[str] = field(default_factory=Counter)


def _compare(cases: list[tuple[str, object, list[object]]], how: str) -> Comparison:
    result = Comparison()
    for name, schema, instances in cases:
        try:
            after = _transformed(schema, how)
        except ConstraintError as exc:  # refused (no superset, or no finite value): nothing to compare
            result.refused[f"{name}: {exc}"[:160]] += 1
            continue
        for instance in instances:
            before_ok = _valid(server_validator_class(schema), schema, instance, result.unjudged)
            if before_ok is None:
                continue
            after_ok = _valid(Draft202012Validator, after, instance, result.unjudged)
            if after_ok is None:
                continue
            result.compared += 1
            if (how == "relax" and before_ok and not after_ok) or (how != "relax" and before_ok != after_ok):
                result.bad.append(f"{name}: {json.dumps(instance)[:80]} before {before_ok} after {after_ok}")
    return result


@pytest.mark.parametrize("how", ["normalize", "rewrite", "relax"])
@pytest.mark.parametrize("corpus", ["draft7", "draft2020-12", "maskbench"])
def test_transformations_keep_meaning_or_widen_it(corpus: str, how: str) -> None:
    cases = maskbench_cases() if corpus == "maskbench" else suite_cases(corpus)
    result = _compare(cases, how)
    assert not result.bad, "\n".join(result.bad[:20])
    assert result.compared >= MIN_COMPARISONS[corpus], (result.compared, result.refused, result.unjudged)
    assert sum(result.unjudged.values()) <= MAX_UNJUDGED, result.unjudged
    assert sum(result.refused.values()) <= MAX_REFUSED, result.refused


def test_draft4_keywords_are_restated() -> None:
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://example.com/s",
              "definitions": {"n": {"type": "number", "minimum": 0, "exclusiveMinimum": True}},
              "type": "object", "properties": {"n": {"$ref": "#/definitions/n", "type": "string"},
                                               "t": {"type": "array", "items": [{"type": "integer"}],
                                                     "additionalItems": False}},
              "dependencies": {"n": ["t"], "t": {"required": ["n"]}}}
    assert draft_of(schema) == "draft-04"
    out = normalize(schema)
    assert out["$id"] == "http://example.com/s" and "id" not in out
    assert out["definitions"]["n"] == {"type": "number", "exclusiveMinimum": 0}
    assert out["properties"]["n"] == {"$ref": "#/definitions/n"}  # draft 4: siblings of $ref are ignored
    assert out["properties"]["t"] == {"type": "array", "prefixItems": [{"type": "integer"}], "items": False}
    assert out["dependentRequired"] == {"n": ["t"]} and out["dependentSchemas"] == {"t": {"required": ["n"]}}
    # A property called "id" is a name, not a keyword: untouched.
    assert normalize({"$schema": "http://json-schema.org/draft-04/schema#", "properties": {"id": {}}}) == {
        "$schema": "http://json-schema.org/draft-04/schema#", "properties": {"id": {}}}


def test_discriminated_one_of_becomes_any_of() -> None:
    cat = {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
           "required": ["kind"]}
    dog = {"type": "object", "properties": {"kind": {"enum": ["dog", "wolf"]}}, "required": ["kind"]}
    assert "anyOf" in rewrite({"oneOf": [cat, dog]})
    # Not disjoint: the discriminator is optional in one branch, or the values overlap, or no type.
    loose = {**dog, "required": []}
    overlapping = {**dog, "properties": {"kind": {"enum": ["cat", "dog"]}}}
    untyped = {k: v for k, v in dog.items() if k != "type"}
    for other in (loose, overlapping, untyped):
        assert "oneOf" in rewrite({"oneOf": [cat, other]})
    assert disjoint({"type": "string"}, {"type": "integer"}, {})
    assert not disjoint({"type": "number"}, {"type": "integer"}, {})
    assert disjoint({"type": "number", "multipleOf": 0.5, "const": 0.5}, {"type": "integer"}, {})


def _check_cases(schema: dict, instances: list[object]) -> None:
    after = rewrite(schema)
    assert after != schema
    for instance in instances:
        assert Draft202012Validator(schema).is_valid(instance) == Draft202012Validator(after).is_valid(instance), \
            instance


def test_dependencies_become_any_of_exactly() -> None:
    schema = {"type": "object", "properties": {"card": {"type": "string"}, "address": {"type": "string"},
                                               "zip": {"type": "string"}},
              "dependentRequired": {"card": ["address"]}, "dependentSchemas": {"address": {"required": ["zip"]}}}
    _check_cases(schema, [{}, {"card": "1"}, {"card": "1", "address": "a"}, {"card": "1", "address": "a", "zip": "z"},
                          {"address": "a"}, {"address": "a", "zip": "z"}, {"zip": "z"}, 3, "x"])


def test_if_then_else_on_a_discriminator_becomes_any_of_exactly() -> None:
    schema = {"type": "object", "properties": {"kind": {"enum": ["a", "b", "c"]}, "v": {}},
              "if": {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
              "then": {"properties": {"v": {"type": "string"}}, "required": ["v"]},
              "else": {"properties": {"v": {"type": "integer"}}}}
    instances: list[object] = [{}, {"kind": "a"}, {"kind": "a", "v": "s"}, {"kind": "a", "v": 1}, {"kind": "b"},
                               {"kind": "b", "v": 1}, {"kind": "b", "v": "s"}, {"v": 1}, {"v": "s"}, {"kind": "z"}]
    _check_cases(schema, instances)
    optional = {**schema, "if": {"properties": {"kind": {"const": "a"}}}}
    _check_cases(optional, instances)


def test_all_of_merges_only_where_exact() -> None:
    merged = rewrite({"type": "object", "allOf": [{"required": ["a"]}, {"properties": {"b": {"type": "integer"}}}]})
    assert merged == {"type": "object", "required": ["a"], "properties": {"b": {"type": "integer"}}}
    closed = {"properties": {"a": {}}, "additionalProperties": False, "allOf": [{"properties": {"b": {}}}]}
    assert rewrite(closed) == closed  # additionalProperties reads its siblings: merging would let "b" in


def test_relax_drops_only_in_positive_positions_and_names_what_it_dropped() -> None:
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                        "uniqueItems": True}},
              "oneOf": [{"required": ["tags"]}, {"properties": {"tags": {"maxItems": 1}}}]}
    result = relax(schema, "llguidance")
    assert ("#/properties/tags", "uniqueItems") in result.relaxed and ("#", "oneOf") in result.relaxed
    assert result.schema["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    with pytest.raises(ConstraintError, match="cannot be relaxed"):
        relax({"type": "object", "properties": {"a": {"$id": "a.json", "$defs": {"x": {}},
                                                      "$ref": "#/properties/a/$defs/x"}}}, "llguidance")


def test_prepare_schema_is_idempotent_on_its_output() -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "properties": {"a": {"$ref": "#/definitions/x", "type": "string"}},
              "definitions": {"x": {"type": "integer"}},
              "allOf": [{"required": ["a"]}]}
    once = prepare_schema(schema)
    assert prepare_schema(once) == once


@pytest.mark.parametrize("negated", [
    {}, True, False, {"not": {"type": "string"}}, {"anyOf": [{"required": ["a"]}, {"type": "array"}]},
    {"allOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"required": ["a", "b"]}, {"type": ["null", "number"]},
])
def test_not_is_restated_positively_and_exactly(negated: object) -> None:
    schema = {"properties": {"a": {}, "b": {}}, "not": negated}
    after = rewrite(schema)
    assert after is False or "not" not in json.dumps(after)
    instances: list[object] = [None, True, 0, 1.5, "s", [], [1], {}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {"c": 1}]
    for instance in instances:
        assert Draft202012Validator(schema).is_valid(instance) == Draft202012Validator(after).is_valid(instance), \
            (negated, instance)


def test_schemas_kept_under_unknown_keys_and_reached_by_ref_are_restated_and_rewritten() -> None:
    """OpenAPI-style ``#/components/...``: not a schema position, but a $ref target."""
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "properties": {"event": {"$ref": "#/components/schemas/Event"}},
              "components": {"schemas": {"Event": {
                  "type": "object", "properties": {"at": {"type": "string", "format": "date-time"},
                                                   "card": {}, "address": {}},
                  "dependencies": {"card": ["address"]}}}}}
    out = prepare_schema(schema)
    event = out["components"]["schemas"]["Event"]
    assert "dependencies" not in event and "anyOf" in event  # restated, then rewritten
    assert event["properties"]["at"]["pattern"].startswith("^(")  # the exact date-time pattern
    assert out["components"] != schema["components"] and "dependencies" in schema["components"]["schemas"]["Event"]
    for instance, valid in (({"event": {"card": 1}}, False), ({"event": {"card": 1, "address": 2}}, True)):
        assert Draft202012Validator(out).is_valid(instance) == valid
