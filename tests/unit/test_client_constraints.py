"""build_request's constraint arguments (the ``constraint`` oneof and its options) and list_schemas."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Iterator
from types import MappingProxyType

import grpc
import pytest
from helpers.grpc_fake import serve_fake

from proctor_client import AsyncProctorClient, ProctorClient, ProctorError, RegisteredSchema, build_request
from proctor_client.v1 import generation_pb2, generation_pb2_grpc

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20}}, "required": ["answer"]}


def test_no_constraint_by_default() -> None:
    request = build_request("hi")
    assert request.WhichOneof("constraint") is None
    assert request.constraint_backend == generation_pb2.CONSTRAINT_BACKEND_UNSPECIFIED
    assert request.json_whitespace == generation_pb2.JSON_WHITESPACE_UNSPECIFIED


def test_json_schema_text_is_sent_as_is_and_a_mapping_is_serialized() -> None:
    text = '{"type": "string"}'
    assert build_request("hi", json_schema=text).json_schema == text
    request = build_request("hi", json_schema=SCHEMA)
    assert request.WhichOneof("constraint") == "json_schema"
    assert json.loads(request.json_schema) == SCHEMA
    nested = MappingProxyType({"type": "object", "properties": MappingProxyType({"a": OrderedDict(type="string")})})
    assert json.loads(build_request("hi", json_schema=nested).json_schema) == {
        "type": "object",
        "properties": {"a": {"type": "string"}},
    }
    assert json.loads(build_request("hi", json_schema={"const": "é"}).json_schema) == {"const": "é"}


def test_empty_json_schema_text_still_selects_the_constraint() -> None:
    # The oneof tracks presence: the server gets an (invalid) empty schema, not an unconstrained request.
    assert build_request("hi", json_schema="").WhichOneof("constraint") == "json_schema"


def test_regex_choice_schema_ref() -> None:
    assert build_request("hi", regex=r"\d+").regex == r"\d+"
    assert build_request("hi", regex="").WhichOneof("constraint") == "regex"
    choice = build_request("hi", choice=("yes", "no"))
    assert choice.WhichOneof("constraint") == "choice" and list(choice.choice.options) == ["yes", "no"]
    ref = build_request(messages=[("user", "draft an NDA")], schema_ref="contract/nda@1")
    assert ref.WhichOneof("constraint") == "schema_ref" and ref.schema_ref == "contract/nda@1"


@pytest.mark.parametrize(
    ("syntax", "expected"),
    [(None, generation_pb2.GRAMMAR_SYNTAX_LARK), ("lark", generation_pb2.GRAMMAR_SYNTAX_LARK),
     ("ebnf", generation_pb2.GRAMMAR_SYNTAX_EBNF), ("EBNF", generation_pb2.GRAMMAR_SYNTAX_EBNF)],
)
def test_grammar_and_its_syntax(syntax: str | None, expected: int) -> None:
    request = build_request("hi", grammar='start: "a"', grammar_syntax=syntax)  # type: ignore[arg-type]
    assert request.WhichOneof("constraint") == "grammar"
    assert request.grammar.text == 'start: "a"' and request.grammar.syntax == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [("auto", generation_pb2.CONSTRAINT_BACKEND_AUTO), ("xgrammar", generation_pb2.CONSTRAINT_BACKEND_XGRAMMAR),
     ("llguidance", generation_pb2.CONSTRAINT_BACKEND_LLGUIDANCE),
     ("outlines", generation_pb2.CONSTRAINT_BACKEND_OUTLINES)],
)
def test_constraint_backend(name: str, expected: int) -> None:
    assert build_request("hi", regex="a", constraint_backend=name).constraint_backend == expected  # type: ignore[arg-type]


def test_json_whitespace() -> None:
    flexible = build_request("hi", json_schema=SCHEMA, json_whitespace="flexible")
    assert flexible.json_whitespace == generation_pb2.JSON_WHITESPACE_FLEXIBLE
    compact = build_request("hi", schema_ref="contract/nda", json_whitespace="compact")
    assert compact.json_whitespace == generation_pb2.JSON_WHITESPACE_COMPACT


@pytest.mark.parametrize(
    "kwargs",
    [
        {"json_schema": SCHEMA, "regex": "a"},
        {"regex": "a", "choice": ["a"]},
        {"grammar": "start: x", "schema_ref": "contract/nda"},
        {"json_schema": "{}", "schema_ref": "contract/nda", "choice": ["a"]},
        {"regex": "", "json_schema": ""},  # empty values count: they set the oneof too
    ],
)
def test_at_most_one_constraint(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="at most one constraint"):
        build_request("hi", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"choice": "yes"}, "not a single string"),
        ({"choice": []}, "at least one option"),
        ({"choice": ["a", 1]}, "must be strings"),
        ({"json_schema": ["not", "a", "schema"]}, "JSON text or a mapping"),
        ({"json_schema": {"default": object()}}, "not JSON-serializable"),
        ({"regex": 5}, "regex must be a string"),
        ({"grammar": "start: x", "grammar_syntax": "bnf"}, "grammar_syntax must be one of lark, ebnf"),
        ({"regex": "a", "grammar_syntax": "lark"}, "grammar_syntax applies to grammar only"),
        ({"regex": "a", "json_whitespace": "flexible"}, "json_whitespace applies to json_schema and schema_ref"),
        ({"json_whitespace": "compact"}, "json_whitespace applies"),
        ({"constraint_backend": "xgrammar"}, "constraint_backend needs a constraint"),
        ({"regex": "a", "constraint_backend": "vllm"}, "constraint_backend must be one of auto, xgrammar"),
        ({"json_schema": SCHEMA, "json_whitespace": "pretty"}, "json_whitespace must be one of compact, flexible"),
    ],
)
def test_bad_constraint_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_request("hi", **kwargs)


# --- list_schemas over a real channel ----------------------------------------------------------------------

REGISTERED = [
    generation_pb2.RegisteredSchema(name="contract/nda", version="1", description="Mutual NDA", schema='{"a":1}'),
    generation_pb2.RegisteredSchema(name="employment/offer", version="1", description="Offer letter", schema="{}"),
]


class FakeGeneration(generation_pb2_grpc.GenerationServicer):
    def __init__(self) -> None:
        self.list_calls = 0
        self.unavailable_first = 0

    def ListSchemas(self, request, context):
        self.list_calls += 1
        if self.list_calls <= self.unavailable_first:
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        return generation_pb2.ListSchemasResponse(schemas=REGISTERED)


@pytest.fixture
def fake() -> Iterator[tuple[FakeGeneration, str]]:
    servicer = FakeGeneration()
    with serve_fake(servicer) as addr:
        yield servicer, addr


def test_sync_list_schemas_retries_unavailable(fake) -> None:
    servicer, addr = fake
    servicer.unavailable_first = 1
    with ProctorClient(addr, backoff_s=0.01, timeout_s=5.0) as client:
        schemas = client.list_schemas()
    assert isinstance(schemas, list) and all(isinstance(s, RegisteredSchema) for s in schemas)
    assert [(s.name, s.version, s.description) for s in schemas] == [
        ("contract/nda", "1", "Mutual NDA"),
        ("employment/offer", "1", "Offer letter"),
    ]
    assert json.loads(schemas[0].schema) == {"a": 1}
    assert servicer.list_calls == 2


def test_async_list_schemas(fake) -> None:
    _, addr = fake

    async def scenario() -> list[generation_pb2.RegisteredSchema]:
        async with AsyncProctorClient(addr, backoff_s=0.01, timeout_s=5.0) as client:
            return await client.list_schemas(timeout_s=5.0)

    assert [s.name for s in asyncio.run(scenario())] == ["contract/nda", "employment/offer"]


def test_list_schemas_on_an_older_server_is_unimplemented() -> None:
    with (
        serve_fake(generation_pb2_grpc.GenerationServicer()) as addr,
        ProctorClient(addr, timeout_s=5.0) as client,
        pytest.raises(ProctorError) as caught,
    ):
        client.list_schemas()
    assert caught.value.code == grpc.StatusCode.UNIMPLEMENTED
