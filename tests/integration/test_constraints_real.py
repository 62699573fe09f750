"""Constrained decoding through gRPC with the real model: outputs obey the constraint, bad constraints
are INVALID_ARGUMENT naming the reason, and pathological ones fail within the limit while other
requests are served."""

from __future__ import annotations

import json
import re
import threading
import time

import grpc
import pytest
from helpers.oracles import assert_valid_json, is_valid_json, registered_schema

from proctor_client import ProctorClient, ProctorError
from proctor_client.v1 import generation_pb2 as pb

pytestmark = pytest.mark.real_model

CONTRACT_PROMPTS = [
    "Draft the agreement between Acme Robotics Ltd (England) and Blue Harbor LLC (Delaware), effective 2025-03-01.",
    "Fill in the contract for Northwind GmbH and Contoso Inc. starting 2026-01-15 under the laws of New York.",
]


def chat(text: str) -> list[tuple[str, str]]:
    return [("system", "You write contracts as JSON."), ("user", text)]


def test_list_schemas_shows_the_registered_contracts(client: ProctorClient) -> None:
    names = {f"{s.name}@{s.version}" for s in client.list_schemas()}
    assert {"contract/nda@1", "contract/service-agreement@1", "employment/offer@1"} <= names
    for entry in client.list_schemas():
        assert json.loads(entry.schema)["type"] == "object"


@pytest.mark.parametrize("ref", ["contract/nda@1", "contract/service-agreement@1", "employment/offer@1"])
def test_registered_schema_yields_valid_json_or_an_honest_length(client: ProctorClient, ref: str) -> None:
    # One prompt per schema here (a contract is ~300-500 tokens on a 2-core CPU); the 20-prompt run
    # per schema is bench/constraints_e2e.py, with its results in bench/README.md.
    response = client.generate(messages=chat(CONTRACT_PROMPTS[0]), schema_ref=ref, max_new_tokens=700,
                               temperature=0, timeout_s=600)
    assert response.HasField("schema_validation")
    assert response.constraint.schema_ref == ref and response.constraint.backend
    schema = registered_schema(client, ref)
    if response.finish_reason == pb.FINISH_REASON_LENGTH:
        assert not response.schema_validation.valid
        assert any("truncated" in e for e in response.schema_validation.errors)
        assert not is_valid_json(response.text, schema)
    else:
        assert response.finish_reason in (pb.FINISH_REASON_CONSTRAINT_COMPLETE, pb.FINISH_REASON_EOS)
        assert response.schema_validation.valid, list(response.schema_validation.errors)
        assert_valid_json(response.text, schema)


def test_truncated_json_is_never_reported_valid(client: ProctorClient) -> None:
    # With close_at_budget (the default) 6 tokens are refused up front: the NDA's shortest valid output is longer.
    with pytest.raises(ProctorError, match=r"INVALID_ARGUMENT: stopping.max_new_tokens: 6 tokens cannot hold"):
        client.generate(messages=chat(CONTRACT_PROMPTS[0]), schema_ref="contract/nda", max_new_tokens=6)
    response = client.generate(messages=chat(CONTRACT_PROMPTS[0]), schema_ref="contract/nda", max_new_tokens=6,
                               close_at_budget=False)
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    assert not response.schema_validation.valid
    assert any("truncated" in e for e in response.schema_validation.errors)
    assert not is_valid_json(response.text, registered_schema(client, "contract/nda"))


def test_choice_returns_exactly_one_option(client: ProctorClient) -> None:
    options = ["approve", "reject", "escalate to legal"]
    for prompt in ["Should we sign this NDA? Answer:", "The contract has a typo. Decision:"]:
        response = client.generate(prompt, choice=options, max_new_tokens=16)
        assert response.text in options
        assert response.finish_reason == pb.FINISH_REASON_CONSTRAINT_COMPLETE
        assert response.constraint.kind == "choice"


def test_regex_date_and_clause_id_are_respected(client: ProctorClient) -> None:
    date = client.generate("The agreement is effective from", regex=r"[0-9]{4}-[0-9]{2}-[0-9]{2}", max_new_tokens=16)
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", date.text), date.text
    clause = client.generate("Clause number:", regex=r"[1-9][0-9]?(\.[1-9][0-9]?){0,2}", max_new_tokens=8)
    assert re.fullmatch(r"[1-9][0-9]?(\.[1-9][0-9]?){0,2}", clause.text), clause.text


def test_inline_schema_with_each_engine(client: ProctorClient) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                                               "confidence": {"type": "integer", "enum": [1, 2, 3]}},
              "required": ["answer", "confidence"], "additionalProperties": False}
    for backend in ("auto", "xgrammar", "llguidance", "outlines"):
        response = client.generate("Is Paris in France? Reply in JSON.", json_schema=schema, constraint_backend=backend,
                                   max_new_tokens=40)
        assert response.schema_validation.valid, (backend, list(response.schema_validation.errors), response.text)
        data = assert_valid_json(response.text, schema)
        assert data["answer"] in ("yes", "no")
        if backend != "auto":
            assert response.constraint.backend == backend


def test_lark_grammar(client: ProctorClient) -> None:
    grammar = 'start: "Clause " NUM ": " WORD\nNUM: /[1-9]/\nWORD: /[a-z]{3,8}/\n'
    response = client.generate("Write one clause heading.", grammar=grammar, grammar_syntax="lark", max_new_tokens=16)
    assert re.fullmatch(r"Clause [1-9]: [a-z]{3,8}", response.text), response.text


def invalid_field(client: ProctorClient, **kwargs: object) -> tuple[str, str]:
    with pytest.raises(ProctorError) as caught:
        client.generate("Hi", max_new_tokens=4, **kwargs)  # type: ignore[arg-type]
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    field, description = caught.value.field_violations[0]
    return field, description


def test_bad_constraints_name_the_reason(client: ProctorClient) -> None:
    field, description = invalid_field(client, json_schema="{not json")
    assert field == "json_schema" and "not valid JSON" in description
    # exact_only: refused (with every problem named) instead of the validated fallback
    two_problems = {"type": "object", "not": {"multipleOf": 2},
                    "properties": {"t": {"type": "array", "uniqueItems": True}}}
    field, description = invalid_field(client, json_schema=two_problems, exact_only=True)
    assert field == "json_schema" and "'not' at #" in description and "'uniqueItems' at #/properties/t" in description
    empty_choice = pb.GenerateRequest(prompt="Hi", choice=pb.ChoiceConstraint())
    with pytest.raises(ProctorError) as caught:
        client.generate(empty_choice)
    assert caught.value.field_violations[0][0] == "choice.options"
    field, description = invalid_field(client, json_schema={"type": "object", "properties": {"n": {
        "type": "integer", "minimum": 0}}}, constraint_backend="outlines", exact_only=True)
    assert field == "json_schema" and "minimum" in description
    for bad in ("(unclosed", "a**", "\\"):  # engines read the last two leniently; they do not compile
        field, description = invalid_field(client, regex=bad)
        assert field == "regex" and "does not compile" in description, (bad, description)
    cycle = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    field, description = invalid_field(client, json_schema=cycle)
    assert field == "json_schema" and "no finite value" in description
    field, description = invalid_field(client, schema_ref="contract/does-not-exist")
    assert field == "schema_ref" and "contract/nda" in description


def test_a_schema_no_engine_enforces_is_served_through_the_validated_fallback(client: ProctorClient) -> None:
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["nda", "msa", "sow"]},
                                                        "minItems": 2, "maxItems": 2, "uniqueItems": True}},
              "required": ["tags"], "additionalProperties": False}
    # A seed: the retries sample with seeds derived from it, so the stream below runs the same attempts.
    response = client.generate("Two document types as JSON:", json_schema=schema, max_new_tokens=24, temperature=0,
                               seed=7)
    info = response.constraint
    assert not info.exact and list(info.relaxed_keywords) == ["uniqueItems at #/properties/tags"]
    assert 1 <= len(response.attempts) <= 3 and response.attempts[0].temperature == 0
    assert response.attempts[-1].valid == response.schema_validation.valid
    tags = json.loads(response.text)["tags"]
    assert response.schema_validation.valid == (len(set(tags)) == 2) == is_valid_json(response.text, schema)
    if not response.schema_validation.valid:
        assert "no valid output in 3 attempts" in response.finish_detail
    chunks = list(client.stream_generate("Two document types as JSON:", json_schema=schema, max_new_tokens=24,
                                         temperature=0, seed=7))
    assert "".join(c.text for c in chunks) == response.text and len(chunks[-1].attempts) == len(response.attempts)


def test_formats_say_how_they_were_held(client: ProctorClient) -> None:
    schema = {"type": "object", "properties": {"start": {"type": "string", "format": "date"},
                                               "mail": {"type": "string", "format": "email"},
                                               "n": {"type": "string", "format": "int64"}},
              "required": ["start", "mail", "n"], "additionalProperties": False}
    response = client.generate("A start date, an e-mail and a number as JSON:", json_schema=schema, max_new_tokens=60)
    handling = {f.format: f.handling for f in response.constraint.formats}
    assert response.schema_validation.valid == is_valid_json(response.text, schema), (
        response.text, list(response.schema_validation.errors))
    assert handling == {"date": pb.FORMAT_HANDLING_ENFORCED, "email": pb.FORMAT_HANDLING_ENFORCED,
                        "int64": pb.FORMAT_HANDLING_ANNOTATION}
    assert response.constraint.exact


def nested(depth: int) -> str:
    """A schema nested ``depth`` objects deep, as text (json.dumps would hit Python's recursion limit)."""
    return '{"type":"object","properties":{"a":' * depth + '{"type":"string"}' + '},"required":["a"]}' * depth


PATHOLOGICAL = {
    "depth 1000": nested(1000),
    "10,000-value enum referenced 50 times": {
        "$defs": {"big": {"enum": [f"value-{i}" for i in range(10_000)]}},
        "type": "object", "properties": {f"p{i}": {"$ref": "#/$defs/big"} for i in range(50)},
        "required": [f"p{i}" for i in range(50)], "additionalProperties": False},  # closed: the object must end
    "nested regex quantifiers": {"type": "string", "pattern": "^((a+)+)+(b*)*(c?)+{0,}$".replace("{0,}", "")},
    "multi-megabyte schema": {"type": "object", "properties": {f"k{i}": {"type": "string", "description": "x" * 200}
                                                                for i in range(12_000)}},
}


PATHOLOGICAL_BUDGET = 640  # tokens: the longest served case (50 enum values, greedy) takes 392


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_pathological_schema_fails_fast_while_others_are_served(client: ProctorClient, server: object,
                                                                  name: str) -> None:
    """Each pathological case is INVALID_ARGUMENT (or, if an engine handles it, a finished, valid result)
    within the limit; a concurrent ordinary request completes meanwhile. The token budget is enough for
    every case an engine serves (the 50 enum values take 392 tokens), so a served one must finish."""
    other: dict[str, object] = {}

    def ordinary() -> None:
        with ProctorClient(server.address, timeout_s=120) as second:  # type: ignore[attr-defined]
            other["response"] = second.generate("Once upon a time", max_new_tokens=8, temperature=0)

    thread = threading.Thread(target=ordinary)
    thread.start()
    start = time.monotonic()
    try:
        response = client.generate("Hi", json_schema=PATHOLOGICAL[name], max_new_tokens=PATHOLOGICAL_BUDGET)
        assert response.finish_reason in (pb.FINISH_REASON_CONSTRAINT_COMPLETE, pb.FINISH_REASON_EOS), (
            pb.FinishReason.Name(response.finish_reason), response.text[-200:])
        assert response.schema_validation.valid, list(response.schema_validation.errors)
        assert_valid_json(response.text, PATHOLOGICAL[name])
    except ProctorError as exc:
        assert exc.code == grpc.StatusCode.INVALID_ARGUMENT, exc
        assert exc.field_violations and exc.field_violations[0][0] == "json_schema"
    elapsed = time.monotonic() - start
    thread.join(120)
    assert "response" in other, "an ordinary request was not served meanwhile"
    # three engines at most, each under the 5 s limit, plus transfer of a multi-megabyte request
    assert elapsed < 30, f"{name} took {elapsed:.1f} s"


def test_a_raised_choice_limit_is_the_one_that_holds(model_dir: object) -> None:
    """``max_choice_options`` raised at start-up: a choice over the default limit is served, and one over the
    raised limit is refused naming the field (the constraint service once read the class default)."""
    from proctor.app import BackgroundServer
    from proctor.config import Settings

    limit = Settings.max_choice_options + 100
    background = BackgroundServer(Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False,
                                                 "max_choice_options": limit}))
    background.start(timeout_s=300)
    try:
        with ProctorClient(background.address, timeout_s=120, retries=0) as own:
            options = [f"option {index:04d}" for index in range(limit)]
            response = own.generate("Pick one option.", choice=options, max_new_tokens=8)
            assert response.text in options
            with pytest.raises(ProctorError) as refused:
                own.generate("Pick one option.", choice=[*options, "one too many"], max_new_tokens=8)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "choice.options" in [name for name, _ in refused.value.field_violations]
    finally:
        background.stop()
