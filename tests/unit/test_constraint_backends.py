"""Every engine adapter against one table of constraints, fed the real tokenizer's own tokens.

Soundness is the property under test: the tokenizer's tokenization of a valid text must pass
(every token's bit set, ``advance`` True, ``can_end`` at the end), and no invalid text may. At
every step the end flags must agree with the mask: ``can_end`` exactly when an EOS bit is set,
``must_end`` exactly when nothing but EOS is. Special tokens (the detokenizer drops them) are
never allowed.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from proctor.constraints.backend import allocate_bitmask, bitmask_to_bool
from proctor.constraints.backends import create_backend
from proctor.constraints.errors import ConstraintError
from proctor.constraints.spec import ConstraintSpec, GrammarSyntax

pytestmark = pytest.mark.real_model

ENGINES = ("xgrammar", "llguidance", "outlines")
ROOT = Path(__file__).resolve().parents[2]
ROW = 1  # fill the second row of a two-row bitmask: row offsets must be honoured


@dataclass(frozen=True)
class Case:
    id: str
    spec: ConstraintSpec
    valid: tuple[str, ...]
    invalid: tuple[str, ...]
    refused: dict[str, str] = field(default_factory=dict)  # engine -> text the ConstraintError must contain
    defects: dict[str, str] = field(default_factory=dict)  # engine -> known engine bug (strict xfail)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 2},
        "active": {"type": "boolean"},
    },
    "required": ["name", "tags", "active"],
    "additionalProperties": False,
}
NO_GRAMMARS = {"outlines": "outlines-core supports no context-free grammars"}
LARK = 'start: NUMBER ("+" NUMBER)*\nNUMBER: /[0-9]+/\n'
EBNF = 'root ::= "(" list? ")"\nlist ::= item ("," item)*\nitem ::= [a-z]+ | root\n'

CASES = [
    Case("json-compact", ConstraintSpec.json_schema(PERSON),
         ('{"name":"Bob","tags":["a"],"active":true}', '{"name":"Zoë Ä 😀","tags":[],"active":false}'),
         ('{"name":"","tags":[],"active":true}', '{"name":"Bob","tags":["c"],"active":true}',
          '{"name":"Bob", "tags":[],"active":true}', '{"name":"Bob","tags":["a","b","a"],"active":true}',
          '{"name":"Bob","tags":[],"active":true,"x":1}', '{"name":"Bob","tags":[]}',
          '{"name":"Bob","tags":[],"active":true} ', ' {"name":"Bob","tags":[],"active":true}')),
    Case("json-flexible", ConstraintSpec.json_schema(PERSON, flexible_whitespace=True),
         ('{"name": "Bob", "tags": ["a", "b"], "active": true}', '{"name":"Bob","tags":[],"active":false}'),
         ('{"name": "", "tags": [], "active": true}', '{"name": "Bob", "tags": [], "active": 1}')),
    Case("json-integer-bounds", ConstraintSpec.json_schema(
        {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 130}},
         "required": ["age"], "additionalProperties": False}),
         ('{"age":42}', '{"age":0}', '{"age":130}'), ('{"age":-1}', '{"age":131}', '{"age":4.5}', '{"age":"4"}'),
         {"outlines": "'minimum' at #/properties/age"}),
    Case("json-ref-nullable-pattern", ConstraintSpec.json_schema(
        {"$defs": {"day": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"}}, "type": "object",
         "properties": {"when": {"anyOf": [{"$ref": "#/$defs/day"}, {"type": "null"}]}},
         "required": ["when"], "additionalProperties": False}),
         ('{"when":"2024-05-01"}', '{"when":null}'),
         ('{"when":"2024-5-01"}', '{"when":"২০২৪-05-01"}', '{"when":"2024-05-01\\n"}', '{"when":1}')),
    # Benchmark findings (maskbench): each invalid text passed the engine before the guard refused the schema.
    Case("json-pattern-dot-takes-quote", ConstraintSpec.json_schema(
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a.+$"}, "t": {"type": "integer"}},
         "required": ["s"], "additionalProperties": False}),
         ('{"s":"ab"}', '{"s":"a\\"b","t":1}', '{"s":"a\\\\"}'),
         ('{"s":"a","t":"x","t":1}', '{"s":"a"}', '{"s":"a\nb"}', '{"s":"a\\"}'),
         {"xgrammar": "'pattern' at #/properties/s",
          "outlines": "'pattern' at #/properties/s"}),
    Case("json-pattern-space-takes-newline", ConstraintSpec.json_schema(
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a\\s$"}}, "required": ["s"],
         "additionalProperties": False}),
         ('{"s":"a "}', '{"s":"a\\n"}'), ('{"s":"a\n"}', '{"s":"a"}', '{"s":"ab"}'),
         {"xgrammar": "'pattern' at #/properties/s",
          "outlines": "'pattern' at #/properties/s"}),
    Case("json-pattern-with-length", ConstraintSpec.json_schema(
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}},
         "required": ["s"], "additionalProperties": False}),
         ('{"s":"abc"}', '{"s":"a"}'), ('{"s":"abcdef"}', '{"s":"AB"}', '{"s":""}'),
         {"xgrammar": "'maxLength' at #/properties/s",
          "outlines": "'pattern' at #/properties/s"}),
    Case("json-format-with-length", ConstraintSpec.json_schema({"type": "string", "format": "email", "maxLength": 8}),
         ('"a@b.co"',), ('"abcdef@example.com"', '"abcdefg"'),
         {"xgrammar": "'maxLength' at #", "outlines": "'format' at #"}),
    # Calendar formats are spelled out as exact patterns (constraints/json_schema/formats.py): enforced by every engine.
    Case("json-date-time-offset", ConstraintSpec.json_schema({"type": "string", "format": "date-time"}),
         ('"2024-12-08T14:30:00Z"', '"2024-02-29T00:00:00.5+05:30"'),
         ('"2024-12-08T14:30:00"', '"2023-02-29T00:00:00Z"', '"2024-12-08T24:00:00Z"')),
    Case("json-true", ConstraintSpec.json_schema(True), ('1', '"x"', '{"a":[null,true]}'), ('', '{"a":}', '[1,]'),
         {"outlines": "Unsupported JSON Schema structure true"}),
    Case("json-false", ConstraintSpec.json_schema(False), (), ('1', '"x"', 'null'),
         {"xgrammar": "cannot accept any value", "llguidance": "the schema `false` admits no value",
          "outlines": "Unsupported JSON Schema structure false"}),
    Case("regex", ConstraintSpec.regex("[0-9]{4}-[0-9]{2}"), ("2024-05", "1999-12"),
         (" 2024-05", "2024-5", "2024-05-", "2024_05", "20245")),
    Case("choice", ConstraintSpec.choice(["approve", "reject", "escalate to legal"]),
         ("approve", "reject", "escalate to legal"), ("approved", "Approve", "escalate", " reject", "")),
    Case("choice-metachars", ConstraintSpec.choice(["a.b", "c/d", "(x)|y", "1+1"]),
         ("a.b", "c/d", "(x)|y", "1+1"), ("axb", "(x)", "y", "11")),
    Case("grammar-lark", ConstraintSpec.grammar(LARK, GrammarSyntax.LARK), ("1+22+333", "7"), ("1+", "+1", "1 + 2"),
         {"xgrammar": "xgrammar does not support Lark grammars; use EBNF or another backend", **NO_GRAMMARS}),
    Case("grammar-ebnf", ConstraintSpec.grammar(EBNF, GrammarSyntax.EBNF), ("(a,b)", "((x),yz)", "()"),
         ("(a,)", "(a", "a", "(A)"), NO_GRAMMARS,
         {"xgrammar": "xgrammar 0.2.9: after '((x' the mask leaves out the tokens '),' and '))' that accept_token "
                      "takes (recursive rule): the canonical tokenization of a valid text is refused"}),
]


@pytest.fixture(scope="module")
def backends(tokenizer):  # type: ignore[no-untyped-def]
    return {name: create_backend(name, tokenizer, len(tokenizer), (tokenizer.eos_token_id,)) for name in ENGINES}


@pytest.fixture(scope="module")
def special_ids(tokenizer) -> list[int]:  # type: ignore[no-untyped-def]
    return sorted(set(tokenizer.all_special_ids) - {tokenizer.eos_token_id})


def allowed_now(matcher, vocab: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    bitmask = allocate_bitmask(2, vocab)
    matcher.fill_bitmask(bitmask, ROW)
    assert torch.all(bitmask[0] == -1), "fill_bitmask wrote outside its row"
    return bitmask_to_bool(bitmask, vocab)[ROW]


def walk(matcher, ids: list[int], vocab: int, eos: int, special: list[int]) -> bool:  # type: ignore[no-untyped-def]
    """Feed ``ids``; True if every token was allowed and the text may end there."""
    for token in [*ids, None]:
        allowed = allowed_now(matcher, vocab)
        assert not allowed[special].any(), "a special token was allowed"
        assert matcher.can_end() == bool(allowed[eos]), "can_end disagrees with the EOS bit"
        only_eos = bool(allowed[eos]) and int(allowed.sum()) == 1
        assert matcher.must_end() == only_eos, "must_end disagrees with the mask"
        if token is None:
            return matcher.can_end()
        if not allowed[token]:
            return False
        assert matcher.advance(token), "advance refused a token the mask allowed"
    raise AssertionError("unreachable")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(request, backends, tokenizer, special_ids, engine: str, case: Case) -> None:  # type: ignore[no-untyped-def]
    if engine in case.defects:
        request.applymarker(pytest.mark.xfail(reason=case.defects[engine], strict=True))
    backend = backends[engine]
    if engine in case.refused:
        with pytest.raises(ConstraintError) as info:
            backend.compile(case.spec)
        expected = case.refused[engine]
        assert expected in str(info.value)
        if expected.startswith("'"):  # a guard refusal: "unsupported keyword(s) 'kw' at #/path, ..."
            assert "unsupported keyword" in str(info.value)
        return
    compiled = backend.compile(case.spec)
    assert compiled.backend == engine and compiled.spec == case.spec
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    for text in case.valid:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert walk(compiled.new_matcher(), ids, vocab, eos, special_ids), f"{engine} rejected valid {text!r}"
    for text in case.invalid:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert not walk(compiled.new_matcher(), ids, vocab, eos, special_ids), f"{engine} accepted invalid {text!r}"


@pytest.mark.parametrize("engine", ENGINES)
def test_serialized_constraint_loads_and_behaves_the_same(backends, tokenizer, engine: str) -> None:  # type: ignore[no-untyped-def]
    backend = backends[engine]
    spec = CASES[0].spec
    original = backend.compile(spec)
    data = original.to_bytes()
    assert isinstance(data, bytes) and data and original.memory_bytes() > 0
    loaded = backend.load(spec, data)
    assert loaded.spec == spec and loaded.backend == engine
    first, second = original.new_matcher(), loaded.new_matcher()
    for token in tokenizer.encode(CASES[0].valid[0], add_special_tokens=False):
        assert torch.equal(allowed_now(first, len(tokenizer)), allowed_now(second, len(tokenizer)))
        assert first.advance(token) and second.advance(token)
    assert first.can_end() and second.can_end() and first.must_end() and second.must_end()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("data", [b"\x00not a compiled constraint", b"\xff\xfe"])
def test_loading_garbage_is_a_constraint_error(backends, engine: str, data: bytes) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConstraintError):
        backends[engine].load(CASES[0].spec, data)


@pytest.mark.parametrize("engine", ENGINES)
def test_unsupported_keyword_is_refused_with_its_path(backends, engine: str) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "properties": {"a": {"type": "integer", "not": {"const": 3}}}, "required": ["a"]}
    with pytest.raises(ConstraintError) as info:
        backends[engine].compile(ConstraintSpec.json_schema(schema))
    assert "unsupported keyword 'not' at #/properties/a" in str(info.value)
    assert info.value.backend == engine


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("spec", "text", "must"), [
    (ConstraintSpec.choice(["yes", "no"]), "yes", True),
    (ConstraintSpec.regex("[0-9]{3}"), "123", True),
    (ConstraintSpec.regex("[0-9]+"), "12", False),
    (ConstraintSpec.json_schema({"type": "boolean"}), "true", True),
])
def test_end_flags_after_a_complete_text(backends, tokenizer, engine: str, spec: ConstraintSpec, text: str,  # type: ignore[no-untyped-def]
                                         must: bool) -> None:
    matcher = backends[engine].compile(spec).new_matcher()
    assert not matcher.can_end() and not matcher.must_end()
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert matcher.advance(token)
    assert matcher.can_end()
    assert matcher.must_end() is must
    allowed = allowed_now(matcher, len(tokenizer))
    assert bool(allowed[tokenizer.eos_token_id])
    assert (int(allowed.sum()) == 1) is must


@pytest.mark.parametrize("engine", ENGINES)
def test_padding_ids_and_extra_eos_ids(tokenizer, special_ids, engine: str) -> None:  # type: ignore[no-untyped-def]
    """A model vocabulary larger than the tokenizer's, and two EOS ids (the second a special token)."""
    vocab, eos = len(tokenizer) + 64, (tokenizer.eos_token_id, special_ids[0])
    backend = create_backend(engine, tokenizer, vocab, eos)
    matcher = backend.compile(ConstraintSpec.regex("[a-z]{0,3}")).new_matcher()
    allowed = allowed_now(matcher, vocab)
    assert not allowed[len(tokenizer):].any(), "a padding id was allowed"
    assert allowed[list(eos)].all(), "every EOS id is allowed where the constraint may end"
    assert not allowed[special_ids[1:]].any()
    for token in tokenizer.encode("abc", add_special_tokens=False):
        assert matcher.advance(token)
    assert matcher.must_end()
    allowed = allowed_now(matcher, vocab)
    assert allowed[list(eos)].all() and int(allowed.sum()) == 2


def test_unknown_backend_name_is_a_value_error(tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="unknown constraint backend"):
        create_backend("guidance", tokenizer, len(tokenizer), (tokenizer.eos_token_id,))


def test_engines_are_imported_only_when_a_backend_is_built() -> None:
    code = ("import sys\nimport proctor.constraints.backends\nimport proctor.constraints.json_schema.support\n"
            "print(sorted(m for m in ('xgrammar', 'llguidance', 'outlines_core') if m in sys.modules))")
    env = {"PYTHONPATH": f"{ROOT / 'service'}:{ROOT / 'clients' / 'python' / 'src'}"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("engine", ENGINES)
def test_rollback_restores_the_earlier_state(backends, tokenizer, engine: str) -> None:  # type: ignore[no-untyped-def]
    """The forbidden-phrase lookahead advances and rolls back matchers: the masks must come back."""
    vocab = len(tokenizer)
    matcher = backends[engine].compile(ConstraintSpec.choice(["alpha beta", "alpha gamma", "delta"])).new_matcher()
    tokens = tokenizer.encode("alpha beta", add_special_tokens=False)
    masks = [allowed_now(matcher, vocab)]
    for token in tokens:
        assert matcher.advance(token)
        masks.append(allowed_now(matcher, vocab))
    for back in range(1, len(tokens) + 1):
        matcher.rollback(1)
        assert torch.equal(allowed_now(matcher, vocab), masks[-1 - back]), f"after rolling back {back}"
    assert matcher.advance(tokens[0]) and torch.equal(allowed_now(matcher, vocab), masks[1])
