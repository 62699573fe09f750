"""The shortest valid value of a JSON schema (json_schema/shortest.py; issue 45's closer starts from it): each
keyword it covers, what it says it does not, and on real schemas (MaskBench's sample) every value it gives is
accepted by the constraint engine's own matcher, and is no longer than the shortest valid instance the benchmark
lists."""

from __future__ import annotations

import json

import pytest
from test_constraint_backends_suite import accepts, maskbench_sample

from proctor.constraints.json_schema.shortest import shortest_value

CASES = [
    ({"type": "object", "required": ["name", "tags", "kind"], "properties": {
        "name": {"type": "string", "minLength": 2},
        "tags": {"type": "array", "minItems": 2, "items": {"enum": ["xx", "y"]}},
        "kind": {"const": "nda"}, "note": {"type": "string"}}},
     '{"name":"aa","tags":["y","y"],"kind":"nda"}'),
    ({"$defs": {"party": {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer",
                                                                                      "minimum": 3}}}},
      "type": "object", "required": ["buyer"], "properties": {"buyer": {"$ref": "#/$defs/party"}}},
     '{"buyer":{"id":3}}'),
    ({"type": ["string", "null"]}, "null"),
    ({"type": "number", "exclusiveMaximum": 0, "multipleOf": 0.5}, "-1"),
    ({"type": "number", "minimum": 0.25, "maximum": 0.75, "multipleOf": 0.25}, "0.5"),
    ({"anyOf": [{"type": "string", "minLength": 9}, {"type": "boolean"}]}, "true"),
    ({"type": "string", "format": "date"}, '"2000-01-01"'),
    ({"type": "object", "minProperties": 1, "properties": {"a": {"type": "null"}}}, '{"a":null}'),
    ({"type": "string", "pattern": "^[A-Z]{3}-\\d$"}, '"AAA-0"'),
    ({"type": "string", "pattern": "mailto:"}, '"mailto:"'),  # a pattern matches anywhere: nothing around it
]


@pytest.mark.parametrize(("schema", "expected"), CASES)
def test_each_keyword_gives_its_shortest_value(schema: dict, expected: str) -> None:
    found = shortest_value(schema)
    assert found is not None and found.text == expected


@pytest.mark.parametrize("schema", [{"type": "string", "pattern": "^(?=a)b$"}, {"not": {"type": "null"}},
                                    {"type": "array", "minItems": 2, "uniqueItems": True},
                                    {"$ref": "https://example.com/remote.json"}])
def test_what_it_does_not_cover_it_says_so(schema: dict) -> None:
    assert shortest_value(schema) is None


def test_on_real_schemas_every_value_is_accepted_by_the_matcher_and_none_is_longer_than_needed(tokenizer) -> None:  # type: ignore[no-untyped-def]
    from proctor.constraints.backends import create_backend
    from proctor.constraints.spec import ConstraintSpec

    backend = create_backend("llguidance", tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    sample = maskbench_sample()
    covered, refused, longer = 0, [], []
    for item in sample:
        found = shortest_value(item["schema"])
        if found is None:
            continue
        covered += 1
        try:
            compiled = backend.compile(ConstraintSpec.json_schema(item["schema"]))
        except Exception:  # a schema the engine does not compile: nothing to hold the value to
            continue
        if not accepts(compiled, tokenizer, found.text):
            refused.append(f"{item['name']}: {found.text[:120]}")
        valid = [json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
                 for group in item.get("tests", []) for test in ([group] if "data" in group else group["tests"])
                 if test.get("valid")]
        if valid and len(found.text) > min(map(len, valid)):
            longer.append(item["name"])
    assert covered >= 0.75 * len(sample), f"{covered} of {len(sample)} covered"
    assert not refused, "\n".join(refused)
    assert len(longer) <= 0.01 * covered, longer
