"""``generate``'s constraint flags and the ``schemas`` command, against a real gRPC server with a fake servicer."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.grpc_fake import serve_fake

from proctor_client import cli
from proctor_client.v1 import generation_pb2, generation_pb2_grpc

ANSWER = '{"answer":"yes"}'
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
USAGE = generation_pb2.Usage(prompt_tokens=3, completion_tokens=5)
ERRORS = ["at $.answer: 5 is not of type 'string'", "at $: 'extra' was unexpected"]


class FakeGeneration(generation_pb2_grpc.GenerationServicer):
    """Echoes a JSON answer; JSON constraints get a SchemaValidation (invalid when the prompt is "invalid")."""

    def __init__(self) -> None:
        self.requests: list[generation_pb2.GenerateRequest] = []
        self.schemas: list[generation_pb2.RegisteredSchema] = [
            generation_pb2.RegisteredSchema(name="contract/nda", version="1", description="Mutual NDA", schema="{}"),
            generation_pb2.RegisteredSchema(
                name="contract/service-agreement", version="1", description="Services", schema="{}"
            ),
            generation_pb2.RegisteredSchema(name="contract/nda", version="2", description="", schema="{}"),
        ]

    def _extras(self, request: generation_pb2.GenerateRequest) -> dict:
        self.requests.append(request)
        kind = request.WhichOneof("constraint")
        if kind is None:
            return {}
        extras: dict = {
            "constraint": generation_pb2.ConstraintInfo(
                kind="json_schema" if kind == "schema_ref" else kind,
                backend="xgrammar",
                schema_ref="contract/nda@1" if kind == "schema_ref" else "",
            )
        }
        if kind in ("json_schema", "schema_ref"):
            invalid = request.prompt == "invalid"
            extras["schema_validation"] = generation_pb2.SchemaValidation(
                valid=not invalid, errors=ERRORS if invalid else []
            )
        return extras

    def Generate(self, request, context):
        extras = self._extras(request)
        return generation_pb2.GenerateResponse(
            text=ANSWER, finish_reason=generation_pb2.FINISH_REASON_CONSTRAINT_COMPLETE, usage=USAGE, **extras
        )

    def StreamGenerate(self, request, context):
        extras = self._extras(request)
        yield generation_pb2.GenerateChunk(text=ANSWER[:5])
        yield generation_pb2.GenerateChunk(text=ANSWER[5:])
        yield generation_pb2.GenerateChunk(finish_reason=generation_pb2.FINISH_REASON_EOS, usage=USAGE, **extras)

    def ListSchemas(self, request, context):
        return generation_pb2.ListSchemasResponse(schemas=self.schemas)


@pytest.fixture
def fake() -> Iterator[tuple[FakeGeneration, str]]:
    servicer = FakeGeneration()
    with serve_fake(servicer) as addr:
        yield servicer, addr


@pytest.fixture
def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "answer.schema.json"
    path.write_text(json.dumps(SCHEMA, indent=2) + "\n", encoding="utf-8")
    return path


def generate(addr: str, *flags: str, prompt: str = "hi") -> list[str]:
    return ["generate", "--addr", addr, "--prompt", prompt, *flags]


def test_json_schema_file_is_sent_as_is_and_the_summary_says_valid(fake, schema_file: Path, capsys) -> None:
    servicer, addr = fake
    assert cli.main(generate(addr, "--json-schema", str(schema_file), "--constraint-backend", "xgrammar")) == 0
    out, err = capsys.readouterr()
    assert out == ANSWER + "\n"
    summary = err.splitlines()
    assert len(summary) == 1
    assert "schema_valid=true" in summary[0]
    assert "constraint=json_schema" in summary[0] and "backend=xgrammar" in summary[0]
    sent = servicer.requests[0]
    assert sent.WhichOneof("constraint") == "json_schema"
    assert sent.json_schema == schema_file.read_text(encoding="utf-8")
    assert sent.constraint_backend == generation_pb2.CONSTRAINT_BACKEND_XGRAMMAR


def test_json_schema_from_stdin(fake, monkeypatch, capsys) -> None:
    servicer, addr = fake
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(SCHEMA)))
    assert cli.main(generate(addr, "--json-schema", "-", "--json-whitespace", "flexible")) == 0
    capsys.readouterr()
    assert json.loads(servicer.requests[0].json_schema) == SCHEMA
    assert servicer.requests[0].json_whitespace == generation_pb2.JSON_WHITESPACE_FLEXIBLE


def test_invalid_output_prints_the_validation_errors(fake, schema_file: Path, capsys) -> None:
    _, addr = fake
    assert cli.main(generate(addr, "--json-schema", str(schema_file), prompt="invalid")) == 0
    out, err = capsys.readouterr()
    assert out == ANSWER + "\n"
    lines = err.splitlines()
    assert "schema_valid=false" in lines[0]
    assert lines[1:] == [f"  schema error: {error}" for error in ERRORS]


def test_stream_summary_carries_the_validation(fake, capsys) -> None:
    _, addr = fake
    assert cli.main(generate(addr, "--schema-ref", "contract/nda", "--stream", prompt="invalid")) == 0
    out, err = capsys.readouterr()
    assert out == ANSWER + "\n"
    lines = err.splitlines()
    assert "schema_valid=false" in lines[0] and "schema_ref=contract/nda@1" in lines[0]
    assert lines[1] == f"  schema error: {ERRORS[0]}"


def test_json_output_includes_the_validation(fake, capsys) -> None:
    _, addr = fake
    assert cli.main(generate(addr, "--schema-ref", "contract/nda@1", "--output", "json", prompt="invalid")) == 0
    response = json.loads(capsys.readouterr().out)
    assert response["schema_validation"] == {"errors": ERRORS}  # valid=false is the default, so not printed
    assert response["constraint"]["schema_ref"] == "contract/nda@1"


def test_no_constraint_no_validation_in_the_summary(fake, capsys) -> None:
    servicer, addr = fake
    assert cli.main(generate(addr)) == 0
    err = capsys.readouterr().err
    assert "schema_valid" not in err and "constraint=" not in err
    assert servicer.requests[0].WhichOneof("constraint") is None


def test_regex_choice_and_schema_ref(fake, capsys) -> None:
    servicer, addr = fake
    assert cli.main(generate(addr, "--regex", r"[0-9]+", "--constraint-backend", "llguidance")) == 0
    assert cli.main(generate(addr, "--choice", "yes", "--choice", "no")) == 0
    assert cli.main(generate(addr, "--schema-ref", "contract/nda@1", "--json-whitespace", "compact")) == 0
    err = capsys.readouterr().err
    assert "constraint=regex" in err and "constraint=choice" in err
    regex, choice, ref = servicer.requests
    assert regex.regex == "[0-9]+" and regex.constraint_backend == generation_pb2.CONSTRAINT_BACKEND_LLGUIDANCE
    assert list(choice.choice.options) == ["yes", "no"]
    assert ref.schema_ref == "contract/nda@1" and ref.json_whitespace == generation_pb2.JSON_WHITESPACE_COMPACT


@pytest.mark.parametrize(
    ("filename", "flags", "syntax"),
    [
        ("g.lark", [], generation_pb2.GRAMMAR_SYNTAX_LARK),
        ("g.gbnf", [], generation_pb2.GRAMMAR_SYNTAX_EBNF),
        ("g.EBNF", [], generation_pb2.GRAMMAR_SYNTAX_EBNF),
        ("g.txt", [], generation_pb2.GRAMMAR_SYNTAX_LARK),
        ("g.lark", ["--grammar-syntax", "ebnf"], generation_pb2.GRAMMAR_SYNTAX_EBNF),
        ("g.gbnf", ["--grammar-syntax", "lark"], generation_pb2.GRAMMAR_SYNTAX_LARK),
    ],
)
def test_grammar_syntax_by_flag_or_suffix(fake, tmp_path: Path, capsys, filename: str, flags: list[str],
                                          syntax: int) -> None:
    servicer, addr = fake
    path = tmp_path / filename
    path.write_text('root ::= "yes" | "no"\n', encoding="utf-8")
    assert cli.main(generate(addr, "--grammar", str(path), *flags)) == 0
    capsys.readouterr()
    sent = servicer.requests[0]
    assert sent.WhichOneof("constraint") == "grammar"
    assert sent.grammar.text == 'root ::= "yes" | "no"\n' and sent.grammar.syntax == syntax


def test_two_constraints_are_a_usage_error(schema_file: Path, capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["generate", "--prompt", "hi", "--regex", "a", "--choice", "a"])
    assert caught.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["generate", "--prompt", "hi", "--json-schema", str(schema_file), "--schema-ref", "contract/nda"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--grammar-syntax", "ebnf"], "grammar_syntax applies to grammar only"),
        (["--regex", "a", "--json-whitespace", "flexible"], "json_whitespace applies"),
        (["--constraint-backend", "outlines"], "constraint_backend needs a constraint"),
        (["--choice", ""], None),  # an empty option is the server's to judge: not a local error
    ],
)
def test_option_without_its_constraint_is_a_usage_error(fake, flags: list[str], message: str | None,
                                                          capsys) -> None:
    _, addr = fake
    code = cli.main(generate(addr, *flags))
    err = capsys.readouterr().err
    if message is None:
        assert code == 0
    else:
        assert code == 2 and err.startswith("error: ") and message in err


def test_bad_local_schema_files_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    assert cli.main(["generate", "--prompt", "hi", "--json-schema", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {bad}: not valid JSON")
    assert cli.main(["generate", "--prompt", "hi", "--grammar", str(tmp_path / "missing.lark")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    monkeypatch.setattr("sys.stdin", io.StringIO("[]"))
    assert cli.main(["generate", "--messages", "-", "--json-schema", "-"]) == 2
    assert "only one of --messages and --json-schema can read stdin" in capsys.readouterr().err


def test_schemas_text(fake, capsys) -> None:
    _, addr = fake
    assert cli.main(["schemas", "--addr", addr]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "contract/nda@1                Mutual NDA",
        "contract/service-agreement@1  Services",
        "contract/nda@2",
    ]


def test_schemas_json(fake, capsys) -> None:
    servicer, addr = fake
    assert cli.main(["schemas", "--addr", addr, "--output", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)["schemas"]
    assert [(s["name"], s["version"]) for s in listed] == [("contract/nda", "1"), ("contract/service-agreement", "1"),
                                                          ("contract/nda", "2")]
    assert listed[2]["description"] == "" and listed[0]["schema"] == "{}"

    servicer.schemas = []
    assert cli.main(["schemas", "--addr", addr, "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"schemas": []}
    assert cli.main(["schemas", "--addr", addr]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "no schemas registered" in err


def test_schemas_on_a_server_without_the_rpc_exits_1(capsys) -> None:
    with serve_fake(generation_pb2_grpc.GenerationServicer()) as addr:
        assert cli.main(["schemas", "--addr", addr]) == 1
    assert capsys.readouterr().err.startswith("error: UNIMPLEMENTED")


def test_a_schema_nested_beyond_python_parsing_is_left_to_the_server(fake, tmp_path: Path, capsys) -> None:
    servicer, addr = fake
    deep = tmp_path / "deep.json"
    deep.write_text('{"type":"object","properties":{"a":' * 1000 + "{}" + "}}" * 1000, encoding="utf-8")
    assert cli.main(generate(addr, "--json-schema", str(deep), "--exact-only")) == 0
    capsys.readouterr()
    sent = servicer.requests[0]
    assert sent.json_schema == deep.read_text(encoding="utf-8") and sent.constraint_exact_only
