"""Structured output over HTTP without a model: closing a schema's objects only narrows it (checked on real
schemas), compositions stay open, vLLM's extension names land on the same constraint as ours, and a bad
spelling is a 400 naming its key."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from helpers.requirements import BENCHDATA, missing, require_module

from proctor.constraints.json_schema.closing import close_objects
from proctor.openai_http.body import CHAT, parse_body
from proctor.openai_http.errors import BodyError

jsonschema = require_module("jsonschema")
MASKBENCH = BENCHDATA / "maskbench"
SAMPLE = 600  # schemas, the same ones every run (ordered by a hash of the name)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def _valid(schema: Any, instance: Any) -> bool:
    validator = jsonschema.validators.validator_for(schema)(schema, format_checker=None)
    return bool(validator.is_valid(instance))


def test_closing_only_narrows_on_real_schemas() -> None:
    """Whatever the closed schema accepts, the original accepts; and most valid instances stay valid."""
    if not MASKBENCH.is_dir():
        missing(f"MaskBench is not at {MASKBENCH}")
    paths = sorted(MASKBENCH.glob("*.json"), key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())[:SAMPLE]
    widened, kept, valid, closed_any = [], 0, 0, 0
    for path in paths:
        item = json.loads(path.read_text(encoding="utf-8"))
        try:
            jsonschema.validators.validator_for(item["schema"]).check_schema(item["schema"])
            closed = close_objects(item["schema"])
        except (jsonschema.SchemaError, RecursionError):
            continue
        closed_any += bool(closed.closed)
        for test in item["tests"]:
            try:
                under_closed = _valid(closed.schema, test["data"])
                under_original = _valid(item["schema"], test["data"])
            except (jsonschema.exceptions._WrappedReferencingError, RecursionError):  # type: ignore[attr-defined]
                continue
            if under_closed and not under_original:
                widened.append(f"{path.name}: {test['description']}")
            if test["valid"]:
                valid += 1
                kept += under_closed
    assert not widened, widened[:10]
    assert closed_any > SAMPLE // 3, "closing should reach most real schemas"
    print(f"closed {closed_any} of {SAMPLE} schemas; {kept} of {valid} valid instances still valid")
    assert kept > valid // 2, (kept, valid)


def test_compositions_and_maps_stay_open() -> None:
    base = {"properties": {"a": {}}}
    composed = {"type": "object", "properties": {"b": {}}, "allOf": [base]}
    assert close_objects(composed).closed == ()  # closing either would refuse the other's key
    union = {"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    assert close_objects(union).closed == ("#/anyOf/0", "#/anyOf/1")  # each branch stands alone
    shared = {"properties": {"kind": {}}, "anyOf": [{"properties": {"a": {}}}]}
    assert close_objects(shared).closed == ()
    referenced = {"$defs": {"A": {"properties": {"a": {}}}}, "allOf": [{"$ref": "#/$defs/A"}, {"required": ["a"]}]}
    assert close_objects(referenced).closed == ()
    described = {"$defs": {"A": {"properties": {"a": {}}}},
                 "properties": {"x": {"allOf": [{"$ref": "#/$defs/A"}], "description": "pydantic's wrapper"}}}
    assert close_objects(described).closed == ("#/$defs/A", "#")
    negated = {"not": {"properties": {"a": {}}}}
    assert close_objects(negated).schema == negated
    free_map = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert close_objects(free_map).schema == free_map
    original = {"properties": {"a": {"properties": {"b": {}}}}}
    close_objects(original)
    assert original == {"properties": {"a": {"properties": {"b": {}}}}}, "the caller's schema is not changed"


@pytest.mark.parametrize(("fields", "check"), [
    ({"guided_json": {"type": "object", "properties": {"a": {}}}},
     lambda c: json.loads(c.text)["additionalProperties"] is False and c.parsed[0]["additionalProperties"] is False),
    ({"guided_json": '{"type": "integer"}'}, lambda c: json.loads(c.text) == {"type": "integer"}),
    ({"guided_regex": "[0-9]+"}, lambda c: c.kind == "regex" and c.text == "[0-9]+"),
    ({"guided_choice": ["yes", "no"]}, lambda c: c.kind == "choice" and list(c.options) == ["yes", "no"]),
    ({"guided_grammar": 'root ::= "a"'}, lambda c: c.kind == "grammar" and c.grammar_syntax == "ebnf"),
    ({"guided_grammar": 'start: "a"'}, lambda c: c.kind == "grammar" and c.grammar_syntax == "lark"),
    ({"structured_outputs": {"json": {"type": "string"}, "disable_fallback": True}},
     lambda c: c.exact_only and json.loads(c.text) == {"type": "string"} == c.parsed[0]),
    ({"structured_outputs": {"regex": "a+", "disable_any_whitespace": False}},
     lambda c: c.text == "a+" and c.flexible_whitespace),
    ({"structured_outputs": {"choice": ["x"]}}, lambda c: list(c.options) == ["x"]),
    ({"structured_outputs": {"json_object": True}}, lambda c: json.loads(c.text) == {"type": "object"}),
    ({"guided_regex": "a", "guided_decoding_backend": "guidance"}, lambda c: c.backend == "llguidance"),
])
def test_vllm_names_set_the_same_constraint(fields: dict[str, Any], check: Any) -> None:
    call = parse_body(chat(**fields), CHAT)
    assert check(call.draft.request().constraint)


@pytest.mark.parametrize(("fields", "param"), [
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": "json"}, "structured_outputs"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_json": [1]}, "guided_json"),
    ({"guided_decoding_backend": "lm-format-enforcer"}, "guided_decoding_backend"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "strict": "yes"}}},
     "response_format.json_schema.strict"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": [1]}}},
     "response_format.json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": 1}}]}, "tools[0].function.strict"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": "yes"},
     "parallel_tool_calls"),
])
def test_bad_spellings_name_their_key(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BodyError) as refused:
        parse_body(chat(**fields), CHAT)
    assert refused.value.param == param and refused.value.status == 400


def test_a_vllm_constraint_is_named_by_its_key_in_later_errors() -> None:
    call = parse_body(chat(guided_json={"type": "object"}), CHAT)
    assert call.params["json_schema"] == "guided_json"
    nested = parse_body(chat(structured_outputs={"regex": "a"}), CHAT)
    assert nested.params["regex"] == "structured_outputs.regex"


def test_a_tools_references_still_resolve_inside_the_call_schema() -> None:
    """pydantic puts nested models in $defs: each tool's $refs are rebased to where its parameters sit."""
    from proctor.constraints.json_schema.keywords import resolve_pointer
    from proctor.openai_http.tools import tool_plan

    nested = {"type": "object", "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}}},
              "properties": {"home": {"$ref": "#/$defs/Address"}}}
    tools = [{"type": "function", "function": {"name": n, "parameters": nested}} for n in ("a", "b")]
    for choice in ("required", {"type": "function", "function": {"name": "b"}}):
        plan = tool_plan({"tools": tools, "tool_choice": choice})
        assert plan is not None
        schema = plan.call_schema()
        refs = [ref for ref in json.dumps(schema).split('"$ref": "')[1:]]
        assert refs and all(resolve_pointer(schema, ref.split('"')[0]) == {
            "type": "object", "properties": {"city": {"type": "string"}}, "additionalProperties": False}
            for ref in refs)
    with pytest.raises(BodyError) as dangling:
        tool_plan({"tools": [{"type": "function", "function": {"name": "c", "parameters": {
            "properties": {"x": {"$ref": "#/$defs/gone"}}}}}]})
    assert dangling.value.param == "tools[0].function.parameters" and "#/$defs/gone" in dangling.value.message
