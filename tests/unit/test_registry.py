"""The schema registry: the shipped contract schemas, name@version resolution, and load-time errors."""

from __future__ import annotations

import copy
import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.requirements import require_module

from proctor.constraints.json_schema.validation import CHECKED_FORMATS, validate_json_output
from proctor.constraints.registry import (
    SchemaRegistry,
    SchemaRegistryError,
    UnknownSchema,
    default_schema_directory,
    version_key,
)
from proctor.constraints.spec import ConstraintSpec

SHIPPED = {"contract/nda@1", "contract/service-agreement@1", "employment/offer@1"}
# Keywords that constraint engines commonly do not enforce: a shipped schema must not rely on them.
UNENFORCED = {"not", "if", "then", "else", "dependentSchemas", "dependentRequired", "uniqueItems", "contains",
              "multipleOf", "patternProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems"}
DATE_PATTERN = r"^\d{4}-\d{2}-\d{2}$"
UNBOUNDED_QUANTIFIER = re.compile(r"(?<!\\)[+*]|\{\d+,\}")

CLAUSES = [
    {"id": "1", "title": "Definitions", "text": "Terms used in this agreement have the meanings given here."},
    {"id": "2.1", "title": "Obligations", "text": "The receiving party keeps the information confidential."},
]
VALID: dict[str, dict[str, Any]] = {
    "contract/nda": {
        "title": "Mutual Non-Disclosure Agreement",
        "parties": [
            {"name": "Acme Corp.", "jurisdiction": "Delaware, USA", "role": "both"},
            {"name": "Globex GmbH", "jurisdiction": "Germany", "role": "both"},
        ],
        "effective_date": "2025-03-01",
        "term_months": 24,
        "governing_law": "State of New York",
        "confidential_information": "All non-public business, technical and financial information disclosed.",
        "clauses": CLAUSES,
    },
    "contract/service-agreement": {
        "title": "Consulting Services Agreement",
        "provider": {"name": "Initech LLC", "jurisdiction": "Texas, USA"},
        "client": {"name": "Acme Corp.", "jurisdiction": "Delaware, USA"},
        "services": ["Quarterly security review", "On-call support during business hours"],
        "fees": {"amount": 12500, "currency": "USD", "basis": "monthly"},
        "payment_terms_days": 30,
        "start_date": "2025-01-01",
        "end_date": "2025-12-31",
        "governing_law": "State of Texas",
        "clauses": CLAUSES,
    },
    "employment/offer": {
        "employer": {"name": "Acme Corp.", "jurisdiction": "California, USA"},
        "candidate": {"name": "Jane Doe"},
        "position": {"title": "Senior Engineer", "department": "Platform", "employment_type": "full_time"},
        "start_date": "2025-06-02",
        "salary": {"amount": 150000, "currency": "USD", "period": "year"},
        "at_will": True,
        "benefits": ["Health insurance", "401(k) matching"],
        "clauses": CLAUSES,
    },
}


@pytest.fixture(scope="module")
def shipped() -> SchemaRegistry:
    return SchemaRegistry.load()


def write(root: Path, relative: str, content: object) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def entry(description: str = "a test schema", **schema: Any) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "object", **schema}}


# --- the shipped schemas -----------------------------------------------------------------------------------


def test_shipped_schemas_load_and_list_in_order(shipped: SchemaRegistry) -> None:
    assert {e.ref for e in shipped.list()} == SHIPPED
    assert [e.ref for e in shipped.list()] == sorted(SHIPPED)
    assert len(shipped) == 3
    assert SchemaRegistry.load(default_schema_directory()).list() == shipped.list()
    for item in shipped.list():
        assert item.description and item.schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        # Same canonical text as an inline schema: both share one compiled constraint (and cache key).
        assert item.schema_json == ConstraintSpec.json_schema(item.schema).text
        assert json.loads(item.schema_json) == item.schema


@pytest.mark.parametrize("name", sorted(VALID))
def test_hand_written_instance_validates(shipped: SchemaRegistry, name: str) -> None:
    schema = shipped.resolve(name).schema
    for text in (json.dumps(VALID[name], indent=2), json.dumps(VALID[name], separators=(",", ":"))):
        assert validate_json_output(text, schema, truncated=False).errors == ()


@pytest.mark.parametrize("name", sorted(VALID))
@pytest.mark.parametrize("bad_id", ["1.", "a", "2.b", "1..2", " 1", "1\n", "", "1234", "1.2.3.4.5", "١"])
def test_bad_clause_id_fails(shipped: SchemaRegistry, name: str, bad_id: str) -> None:
    instance = copy.deepcopy(VALID[name])
    instance["clauses"][1]["id"] = bad_id
    result = validate_json_output(json.dumps(instance), shipped.resolve(name).schema, truncated=False)
    assert not result.valid
    assert result.errors and all(e.startswith("at $.clauses[1].id: ") for e in result.errors)


@pytest.mark.parametrize(
    ("name", "change", "where"),
    [
        ("contract/nda", {"term_months": 121}, "$.term_months"),
        ("contract/nda", {"effective_date": "2025-13-01"}, "$.effective_date"),
        ("contract/nda", {"parties": VALID["contract/nda"]["parties"][:1]}, "$.parties"),
        ("contract/service-agreement", {"fees": {"amount": -1, "currency": "USD", "basis": "fixed"}}, "$.fees.amount"),
        ("contract/service-agreement", {"fees": {"amount": 1, "currency": "usd", "basis": "fixed"}}, "$.fees.currency"),
        ("employment/offer", {"salary": {"amount": 1, "currency": "EUR", "period": "week"}}, "$.salary.period"),
        ("employment/offer", {"benefits": ["a"] * 6}, "$.benefits"),
        ("employment/offer", {"bonus": 5}, "$"),
    ],
)
def test_shipped_schemas_reject_bad_values(shipped: SchemaRegistry, name: str, change: dict, where: str) -> None:
    instance = {**VALID[name], **change}
    result = validate_json_output(json.dumps(instance), shipped.resolve(name).schema, truncated=False)
    assert not result.valid
    assert any(e.startswith(f"at {where}: ") for e in result.errors), result.errors


def _subschemas(node: Any, where: str = "$") -> list[tuple[str, dict[str, Any]]]:
    """Every schema object in a schema, with its location (data keywords like enum are not schemas)."""
    if not isinstance(node, dict):
        return []
    found = [(where, node)]
    for key in ("properties", "$defs"):
        for name, sub in node.get(key, {}).items():
            found += _subschemas(sub, f"{where}.{key}.{name}")
    if "items" in node:
        found += _subschemas(node["items"], f"{where}.items")
    return found


@pytest.mark.parametrize("ref", sorted(SHIPPED))
def test_shipped_schemas_keep_the_house_rules(shipped: SchemaRegistry, ref: str) -> None:
    """Closed objects, bounded arrays and strings, checked dates, no keywords an engine may ignore."""
    schema = shipped.resolve(ref).schema
    for where, sub in _subschemas(schema):
        assert not UNENFORCED & set(sub), f"{ref} {where} uses {UNENFORCED & set(sub)}"
        kind = sub.get("type")
        if kind == "object":
            assert sub.get("additionalProperties") is False, f"{ref} {where}: additionalProperties must be false"
            assert set(sub.get("required", [])) == set(sub["properties"]), f"{ref} {where}: required incomplete"
        elif kind == "array":
            assert isinstance(sub.get("maxItems"), int) and sub["maxItems"] <= 5, f"{ref} {where}: unbounded array"
        elif kind == "string" and "pattern" in sub:
            # The pattern bounds the length. Never with maxLength: outlines then drops the pattern silently.
            assert not UNBOUNDED_QUANTIFIER.search(sub["pattern"]), f"{ref} {where}: unbounded pattern"
            assert "maxLength" not in sub, f"{ref} {where}: pattern and maxLength together"
        elif kind == "string" and "enum" not in sub:
            assert 0 < sub.get("maxLength", 0) <= 200, f"{ref} {where}: string needs a maxLength <= 200"
        elif kind == "number" or kind == "integer":
            assert "minimum" in sub, f"{ref} {where}: numbers here are never negative"
        if "format" in sub:
            assert sub["format"] in CHECKED_FORMATS, f"{ref} {where}: format {sub['format']} is not checked"
            assert sub["format"] == "date" and sub.get("pattern") == DATE_PATTERN, f"{ref} {where}"
        if "$ref" in sub:
            assert sub["$ref"].startswith("#/$defs/"), f"{ref} {where}"


def _engine_checker(engine: str, tokenizer: Any) -> Callable[[str, str], bool]:
    """``check(schema_json, text)``: does the engine's own JSON-schema compiler accept a complete compact text?

    The tokenizer tables are built once per engine (seconds), the grammars per call (milliseconds).
    """
    if engine == "xgrammar":
        xgr = require_module("xgrammar")
        compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer))

        def check_xgrammar(schema_json: str, text: str) -> bool:
            grammar = compiler.compile_json_schema(schema_json, any_whitespace=False, separators=(",", ":"))
            matcher = xgr.GrammarMatcher(grammar)
            return bool(matcher.accept_string(text) and matcher.accept_token(tokenizer.eos_token_id))

        return check_xgrammar
    if engine == "llguidance":
        llg = require_module("llguidance")
        ll_tokenizer = require_module("llguidance.hf").from_tokenizer(tokenizer)

        def check_llguidance(schema_json: str, text: str) -> bool:
            grammar = llg.LLMatcher.grammar_from_json_schema(schema_json, defaults={"whitespace_flexible": False})
            matcher = llg.LLMatcher(ll_tokenizer, grammar)
            ids = tokenizer(text, add_special_tokens=False).input_ids
            return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()

        return check_llguidance
    outlines = require_module("outlines_core.json_schema")
    return lambda schema_json, text: re.fullmatch(outlines.build_regex_from_schema(schema_json, None), text) is not None


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance", "outlines"])
def test_engines_accept_the_valid_instances_and_refuse_bad_clause_ids(shipped: SchemaRegistry, engine: str,
                                                                      tokenizer: Any) -> None:
    """The schemas are written for the engines: what validates must be producible, a bad clause id must not be.

    Engines emit properties in the order of the schema text they compile (the file's order), so the
    instances are written in schema order.
    """
    accepts = _engine_checker(engine, tokenizer)
    for name, instance in VALID.items():
        entry = shipped.resolve(name)
        text = json.dumps(instance, separators=(",", ":"))
        assert accepts(entry.schema_json, text), f"{engine} refuses {name}"
        bad = copy.deepcopy(instance)
        bad["clauses"][0]["id"] = "1.a"
        assert not accepts(entry.schema_json, json.dumps(bad, separators=(",", ":"))), name


# --- resolution --------------------------------------------------------------------------------------------


def test_resolve_with_and_without_version(tmp_path: Path) -> None:
    for version in ("1", "2", "9", "10", "1.10", "1.9"):
        write(tmp_path, f"contract/nda/{version}.json", entry(f"nda v{version}"))
    registry = SchemaRegistry.load(tmp_path)
    assert registry.resolve("contract/nda").version == "10"  # numeric, not string, ordering
    assert registry.resolve("contract/nda@9").description == "nda v9"
    assert registry.resolve("contract/nda@1.10").ref == "contract/nda@1.10"
    assert [e.version for e in registry.list()] == ["1", "1.9", "1.10", "2", "9", "10"]
    assert version_key("1.10") > version_key("1.9") > version_key("1")


def test_resolve_shipped_latest_equals_pinned(shipped: SchemaRegistry) -> None:
    assert shipped.resolve("contract/nda") == shipped.resolve("contract/nda@1")
    assert shipped.resolve("employment/offer").name == "employment/offer"


def test_unknown_name_lists_close_and_registered_names(shipped: SchemaRegistry) -> None:
    with pytest.raises(UnknownSchema) as caught:
        shipped.resolve("contract/nad@1")
    error = caught.value
    assert isinstance(error, KeyError)
    message = str(error)
    assert message.startswith("unknown schema 'contract/nad@1'")  # no KeyError quoting around the message
    assert "did you mean contract/nda?" in message
    for name in ("contract/nda", "contract/service-agreement", "employment/offer"):
        assert name in message
    assert error.ref == "contract/nad@1" and error.args[0] == message
    assert str(pickle.loads(pickle.dumps(error))) == message


def test_unknown_version_lists_versions(shipped: SchemaRegistry) -> None:
    with pytest.raises(UnknownSchema, match=r"'contract/nda' has the versions 1$"):
        shipped.resolve("contract/nda@2")
    with pytest.raises(KeyError):
        shipped.resolve("contract/nda@")


def test_empty_registry_says_so(tmp_path: Path) -> None:
    registry = SchemaRegistry.load(tmp_path)
    assert registry.list() == [] and len(registry) == 0
    with pytest.raises(UnknownSchema, match="no schemas are registered"):
        registry.resolve("anything")


def test_other_files_are_ignored(tmp_path: Path) -> None:
    write(tmp_path, "a/1.json", entry())
    write(tmp_path, "README.md", "# schemas")
    write(tmp_path, "a/notes.txt", "not a schema")
    assert [e.ref for e in SchemaRegistry.load(tmp_path).list()] == ["a@1"]


# --- load errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("relative", "content", "reason"),
    [
        ("contract/nda/1.json", "{not json", "not valid JSON"),
        ("contract/nda/1.json", [1, 2], "expected an object"),
        ("contract/nda/1.json", {"schema": {"type": "object"}}, "missing ['description']"),
        ("contract/nda/1.json", {**entry(), "shema": {}}, "unexpected ['shema']"),
        ("contract/nda/1.json", {"description": " ", "schema": {}}, "description must be a non-empty string"),
        ("contract/nda/1.json", {"description": "x", "schema": True}, "schema must be a JSON Schema object"),
        ("contract/nda/1.json", entry(properties={"a": {"type": "strin"}}), "invalid JSON Schema at $.properties.a"),
        ("contract/nda/1.json", entry(maxProperties=-1), "invalid JSON Schema at $.maxProperties"),
        ("contract/nda/1.json", entry(properties={"a": {"pattern": "(unclosed"}}), "invalid JSON Schema"),
        ("contract/nda/1.json", entry(**{"$schema": "http://json-schema.org/draft-07/schema#"}), "$schema must be"),
        ("contract/nda/1.json", entry(**{"$ref": "https://example.com/s.json"}), "only local $ref"),
        ("contract/nda/v1.json", entry(), "version 'v1'"),
        ("contract/nda/01.json", entry(), "version '01'"),
        ("Contract/nda/1.json", entry(), "name segment 'Contract'"),
        ("1.json", entry(), "must sit in a folder"),
    ],
)
def test_bad_file_is_a_startup_error_naming_the_file(tmp_path: Path, relative: str, content: object,
                                                     reason: str) -> None:
    write(tmp_path, "good/1.json", entry())
    bad = write(tmp_path, relative, content)
    with pytest.raises(SchemaRegistryError) as caught:
        SchemaRegistry.load(tmp_path)
    assert caught.value.path == bad
    assert str(bad) in str(caught.value)
    assert reason in str(caught.value)
    assert str(pickle.loads(pickle.dumps(caught.value))) == str(caught.value)


def test_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SchemaRegistryError, match="does not exist"):
        SchemaRegistry.load(tmp_path / "nowhere")
