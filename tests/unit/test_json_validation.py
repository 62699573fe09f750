"""validate_json_output: the server's verdict on a finished JSON output (SchemaValidation in responses)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from proctor.constraints.json_schema import validation as json_validation
from proctor.constraints.json_schema.validation import (
    CHECKED_FORMATS,
    MAX_ERRORS,
    TRUNCATED_ERROR,
    InvalidSchemaError,
    ValidationResult,
    check_json_schema,
    ecma_pattern,
    json_path,
    validate_json_output,
)

PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "tags"],
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "tags": {
            "type": "array",
            "maxItems": 3,
            "items": {"type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}}},
        },
        "born": {"type": "string", "format": "date", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
    },
}


def test_valid_output() -> None:
    result = validate_json_output('{"name": "Ada", "tags": [{"x": 1}], "born": "1815-12-10"}', PERSON, truncated=False)
    assert result == ValidationResult(True, ())


def test_invalid_output_reports_paths_sorted() -> None:
    text = json.dumps({"tags": [{"x": 1}, {"x": "two"}], "name": "A" * 11, "extra": 1})
    result = validate_json_output(text, PERSON, truncated=False)
    assert not result.valid
    assert result.errors == (
        "at $: Additional properties are not allowed ('extra' was unexpected)",
        "at $.name: 'AAAAAAAAAAA' is too long",
        "at $.tags[1].x: 'two' is not of type 'integer'",
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "Expecting value"),
        ('{"name": "Ada",}', "Expecting property name"),
        ('{"name": "Ada", "tags": []} trailing', "Extra data"),
        ('{"name": NaN, "tags": []}', "NaN is not a JSON value"),
        ('{"name": "a", "name": "b", "tags": []}', "duplicate object key 'name'"),
        ("[" * 100_000, "nested too deeply"),
    ],
)
def test_not_json(text: str, reason: str) -> None:
    result = validate_json_output(text, PERSON, truncated=False)
    assert not result.valid
    assert len(result.errors) == 1
    assert result.errors[0].startswith("not valid JSON: ") and reason in result.errors[0]


def test_truncated_is_invalid_even_when_the_prefix_parses() -> None:
    # "12" cut from "123" (or a complete-looking object cut before the engine allowed the end) parses fine.
    cut_number = validate_json_output("12", {"type": "integer"}, truncated=True)
    assert cut_number == ValidationResult(False, (TRUNCATED_ERROR,), (("", "truncated"),))
    complete = '{"name": "Ada", "tags": []}'
    assert validate_json_output(complete, PERSON, truncated=True).errors == (TRUNCATED_ERROR,)
    assert validate_json_output(complete, PERSON, truncated=False).valid


def test_truncated_also_reports_parse_and_schema_errors() -> None:
    cut = validate_json_output('{"name": "Ada", "ta', PERSON, truncated=True)
    assert not cut.valid
    assert cut.errors[0] == TRUNCATED_ERROR
    assert cut.errors[1].startswith("not valid JSON: ")
    wrong = validate_json_output('{"name": 5, "tags": []}', PERSON, truncated=True)
    assert wrong.errors == (TRUNCATED_ERROR, "at $.name: 5 is not of type 'string'")


def test_format_date_is_checked() -> None:
    assert "date" in CHECKED_FORMATS and "email" in CHECKED_FORMATS
    schema = {"type": "string", "format": "date"}
    assert validate_json_output('"2024-02-29"', schema, truncated=False).valid
    for bad in ("2023-02-29", "2024-13-01", "2024-1-01", "20240101"):
        result = validate_json_output(json.dumps(bad), schema, truncated=False)
        assert result.errors == (f"at $: {bad!r} is not a 'date'",), bad


def test_unchecked_formats_pass_silently() -> None:
    """Documents the gap: without rfc3339-validator / rfc3986-validator these formats are annotations only."""
    for fmt, bad in (("date-time", "yesterday"), ("uri", "not a uri")):
        if fmt not in CHECKED_FORMATS:
            assert validate_json_output(json.dumps(bad), {"format": fmt}, truncated=False).valid
        else:  # pragma: no cover - depends on the optional packages installed
            assert not validate_json_output(json.dumps(bad), {"format": fmt}, truncated=False).valid


def test_pattern_uses_ecma_semantics() -> None:
    clause_id = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)*$"}
    assert validate_json_output('"2.1"', clause_id, truncated=False).valid
    # Python's `$` would also match before a final newline; ECMA-262's (and the engines') does not.
    assert not validate_json_output(json.dumps("2.1\n"), clause_id, truncated=False).valid
    # Python's \d matches any Unicode digit; ECMA-262's only 0-9.
    digits = {"type": "string", "pattern": r"^\d+$"}
    assert validate_json_output('"2024"', digits, truncated=False).valid
    assert not validate_json_output(json.dumps("２０２４"), digits, truncated=False).valid
    # Literal dollars stay literal.
    assert validate_json_output('"a$"', {"pattern": r"^a[$]$"}, truncated=False).valid
    assert validate_json_output('"a$"', {"pattern": r"^a\$$"}, truncated=False).valid


@pytest.mark.parametrize(
    ("pattern", "rewritten"),
    [
        (r"^a$", r"^a\Z"),
        (r"^a\$$", r"^a\$\Z"),
        (r"[$]$", r"[$]\Z"),
        (r"[^]$]x$", r"[^]$]x\Z"),
        (r"[\]$]$", r"[\]$]\Z"),
        (r"(a|b$)", r"(a|b\Z)"),
        (r"a{2}", r"a{2}"),
    ],
)
def test_ecma_pattern_rewrites_only_bare_dollars(pattern: str, rewritten: str) -> None:
    assert ecma_pattern(pattern) == rewritten


def test_errors_are_capped() -> None:
    schema = {"type": "array", "items": {"type": "string"}}
    result = validate_json_output(json.dumps(list(range(50))), schema, truncated=False)
    assert len(result.errors) == MAX_ERRORS
    assert result.errors[0] == "at $[0]: 0 is not of type 'string'"
    assert result.errors[1] == "at $[1]: 1 is not of type 'string'"  # numeric, not lexicographic, order
    assert result.errors[-1] == f"... and {50 - MAX_ERRORS + 1} more errors"


def test_long_messages_are_shortened() -> None:
    result = validate_json_output(json.dumps("x" * 5000), {"maxLength": 3}, truncated=False)
    assert len(result.errors[0]) < 400 and result.errors[0].endswith("…")


def test_json_path_quotes_non_identifiers() -> None:
    assert json_path([]) == "$"
    assert json_path(["parties", 0, "name"]) == "$.parties[0].name"
    assert json_path(["content-type", "_ok", "a b"]) == '$["content-type"]._ok["a b"]'


def test_remote_refs_are_never_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("validation must not fetch $ref URLs")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    schema = {"type": "object", "properties": {"a": {"$ref": "https://example.com/schema.json"}}}
    result = validate_json_output('{"a": 1}', schema, truncated=False)
    assert not result.valid
    assert "only local $ref" in result.errors[0] and "$.properties.a" in result.errors[0]


def test_unusable_schema_makes_the_output_unverified_not_an_exception() -> None:
    dangling = validate_json_output('{"a": 1}', {"properties": {"a": {"$ref": "#/$defs/missing"}}}, truncated=False)
    assert not dangling.valid and dangling.errors[0].startswith("the schema cannot be evaluated: ")
    bad = validate_json_output("1", {"type": "strin"}, truncated=False)
    assert not bad.valid and "invalid JSON Schema" in bad.errors[0]


def test_check_json_schema() -> None:
    check_json_schema(PERSON)
    check_json_schema(True)
    check_json_schema({"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"})
    with pytest.raises(InvalidSchemaError, match=r"at \$\.properties\.name\.maxLength"):
        check_json_schema({"properties": {"name": {"maxLength": -1}}})
    with pytest.raises(InvalidSchemaError, match="object or a boolean"):
        check_json_schema([])
    # A "$ref" inside data (enum/const) is not a reference.
    check_json_schema({"enum": [{"$ref": "https://example.com"}]})


def test_validators_are_cached_by_canonical_schema() -> None:
    json_validation._validator.cache_clear()
    first = {"type": "object", "properties": {"a": {"type": "integer"}}}
    same_but_reordered = {"properties": {"a": {"type": "integer"}}, "type": "object"}
    assert validate_json_output('{"a": 1}', first, truncated=False).valid
    assert not validate_json_output('{"a": "x"}', same_but_reordered, truncated=False).valid
    info = json_validation._validator.cache_info()
    assert (info.misses, info.hits) == (1, 1)


def test_a_local_ref_that_points_nowhere_is_refused_naming_it() -> None:
    with pytest.raises(json_validation.InvalidSchemaError) as refused:
        json_validation.check_json_schema({"properties": {"a": {"$ref": "#/$defs/missing"}}})
    assert "'$ref' at #/properties/a points to '#/$defs/missing'" in str(refused.value)
    json_validation.check_json_schema({"$defs": {"x": {}}, "properties": {"a": {"$ref": "#/$defs/x"}}})
    json_validation.check_json_schema({"properties": {"a": {"$ref": "#"}}})


def test_each_error_names_its_path_and_keyword_in_order() -> None:
    # What the audit record keeps readable when it seals the messages (which quote the output).
    schema = {"type": "object", "properties": {"name": {"enum": ["Ada"]}, "age": {"type": "integer"}}}
    result = validate_json_output('{"name": "Zelda", "age": "old"}', schema, truncated=False)
    assert result.sites == (("$.age", "type"), ("$.name", "enum"))
    assert len(result.errors) == 2 and "'Zelda'" in result.errors[1]
    assert validate_json_output("{", schema, truncated=False).sites == (("", "json"),)
