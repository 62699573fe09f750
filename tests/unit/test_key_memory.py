"""The key memory (constraints/key_memory/): over every engine's mask, no object completes a key it already has, and
nothing else is taken away.

Checked against a scanner of its own (``repeats_a_key``, written apart from the reader it checks), with the real
tokenizer and the real engines: hand-made outputs at every depth, and random objects cut at random tokens.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from proctor.constraints.backend import allocate_bitmask, bitmask_to_bool
from proctor.constraints.backends import create_backend
from proctor.constraints.key_memory import KeyedCompiled, KeyedMatcher, KeyMemory, key_vocabulary, keyed
from proctor.constraints.spec import ConstraintSpec

ENGINES = ("llguidance", "xgrammar")
FREE: dict[str, Any] = {}
NESTED = {"$defs": {"value": {"anyOf": [
    {"type": "integer"}, {"type": "string"}, {"type": "boolean"}, {"type": "array", "items": {"$ref": "#/$defs/value"}},
    {"type": "object", "additionalProperties": {"$ref": "#/$defs/value"}}]}},
    "type": "object", "additionalProperties": {"$ref": "#/$defs/value"}}


def repeats_a_key(text: str) -> bool:
    """Whether the JSON text ``text`` (complete or not) completes some key twice in one object."""
    stack: list[set[str] | None] = []  # per open container: the object's keys, None for an array
    want_key = in_string = escaped = False
    is_key, chars = False, []
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                if is_key:
                    key = json.loads('"' + "".join(chars) + '"')
                    top = stack[-1]
                    assert top is not None
                    if key in top:
                        return True
                    top.add(key)
                continue
            chars.append(char)
        elif char == '"':
            in_string, is_key, chars, want_key = True, want_key, [], False
        elif char == "{":
            stack.append(set())
            want_key = True
        elif char == "[":
            stack.append(None)
        elif char in "]}":
            stack.pop()
            want_key = False
        elif char == ",":
            want_key = bool(stack) and stack[-1] is not None
    return False


@pytest.fixture(scope="module")
def backends(tokenizer):  # type: ignore[no-untyped-def]
    return {name: create_backend(name, tokenizer, len(tokenizer), (tokenizer.eos_token_id,)) for name in ENGINES}


def keyed_matcher(backends, tokenizer, engine: str, schema: Any,  # type: ignore[no-untyped-def]
                  memory: str = "served") -> KeyedMatcher:
    """A matcher under the memory the server uses (the compiled one where it builds), or layer.py's (``python``)."""
    compiled = keyed(backends[engine].compile(ConstraintSpec.json_schema(schema)), tokenizer, len(tokenizer))
    assert isinstance(compiled, KeyedCompiled)
    if memory == "python":
        vocab = key_vocabulary(tokenizer, len(tokenizer))
        compiled = KeyedCompiled(compiled.inner, lambda: KeyMemory(vocab, {}))
    return compiled.new_matcher()


def text_of(tokenizer, ids: list[int]) -> str:  # type: ignore[no-untyped-def]
    vocab = key_vocabulary(tokenizer, len(tokenizer))
    joined = "".join(vocab.texts[i] or "" for i in ids)
    return joined.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def allowed(matcher: KeyedMatcher, size: int, *, inner: bool = False) -> Any:
    bitmask = allocate_bitmask(1, size)
    (matcher.inner if inner else matcher).fill_bitmask(bitmask, 0)
    return bitmask_to_bool(bitmask, size)[0]


def check_exact(matcher: KeyedMatcher, tokenizer, written: list[int]) -> int:  # type: ignore[no-untyped-def]
    """Every token the engine allows from here: the memory bans it iff it completes a key twice. Returns the bans."""
    size = len(tokenizer)
    vocab = key_vocabulary(tokenizer, size)
    keyed_allowed, engine_allowed = allowed(matcher, size), allowed(matcher, size, inner=True)
    assert not bool((keyed_allowed & ~engine_allowed).any()), "the memory only takes tokens away"
    banned = (engine_allowed & ~keyed_allowed).nonzero().flatten().tolist()
    prefix = text_of(tokenizer, written)
    assert not repeats_a_key(prefix)
    for token in set(vocab.quoted) | set(banned):
        if bool(engine_allowed[token]):
            repeats = repeats_a_key(prefix + text_of(tokenizer, [token]))
            assert repeats == (token in banned), (prefix, vocab.texts[token])
    return len(banned)


@pytest.mark.parametrize("memory", ["served", "python"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("schema", "written"), [
    (FREE, '{"a":1,"'),  # the key's first character
    (FREE, '{"a":1,"b":2,"'),
    (FREE, '{"ab":1,"a'),  # a key begun: "a" is free, "ab" is not
    (FREE, '{"a":"x"'),  # a string value: the next key may not be "a" (`,"a"` in one token)
    (FREE, '{"a":1'),  # a number
    (FREE, '{"a":true'),  # a literal
    (NESTED, '{"x":{"a":1,"'),  # depth 2
    (NESTED, '{"x":[{"a":1},{"a":2,"'),  # objects in an array: each its own keys
    (NESTED, '{"x":{"y":{"z":{"a":1,"b":{}'),  # depth 4, after a closed object
    (NESTED, '{"a":{"a":{"a":1},"'),  # the same key in each of three objects
])
def test_a_key_written_is_never_completed_again_at_any_depth(backends, tokenizer, engine: str, schema: Any,  # type: ignore[no-untyped-def]
                                                            written: str, memory: str) -> None:
    matcher = keyed_matcher(backends, tokenizer, engine, schema, memory)
    ids = list(tokenizer.encode(written, add_special_tokens=False))
    for token in ids:
        assert matcher.advance(token), (engine, written)
    check_exact(matcher, tokenizer, ids)
    if written.endswith(',"'):  # then "a", which every object here has: its closing quote is banned
        ids.append(tokenizer.convert_tokens_to_ids("a"))
        assert matcher.advance(ids[-1])
        assert check_exact(matcher, tokenizer, ids) > 0


def test_a_repeated_key_is_refused_by_advance_and_rollback_forgets(backends, tokenizer) -> None:  # type: ignore[no-untyped-def]
    matcher = keyed_matcher(backends, tokenizer, "xgrammar", FREE)
    ids = list(tokenizer.encode('{"a":1,"', add_special_tokens=False))
    for token in ids:
        assert matcher.advance(token)
    letter, quote = tokenizer.convert_tokens_to_ids(["a", '"'])
    ids.append(letter)
    assert matcher.advance(letter) and not matcher.advance(quote)  # "a" again: its closing quote is refused
    assert matcher.memory.written() == [("a",)] and quote in matcher.memory.banned()
    matcher.rollback(len(ids) - 1)  # back to `{`: no key written
    assert matcher.memory.written() == [()] and matcher.memory.banned() == ()
    for token in ids[1:]:
        assert matcher.advance(token)
    assert quote in matcher.memory.banned()


def test_forced_and_drafted_tokens_stop_before_a_repeated_key(backends, tokenizer) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    matcher = keyed_matcher(backends, tokenizer, "llguidance", schema)
    assert hasattr(matcher, "valid_prefix") and hasattr(matcher, "forced_tokens") and hasattr(matcher, "fork")
    ids = list(tokenizer.encode('{"a":1,"', add_special_tokens=False))
    draft = list(tokenizer.encode('a":2}', add_special_tokens=False))
    assert matcher.valid_prefix(ids) == len(ids)
    for token in ids:
        assert matcher.advance(token)
    assert matcher.inner.valid_prefix(draft) == len(draft)  # type: ignore[attr-defined]  # the engine takes "a" again
    assert matcher.valid_prefix(draft) == 1  # the memory cuts the draft at the key's closing quote
    twin = matcher.fork()
    assert twin.memory.written() == matcher.memory.written()
    plain = keyed_matcher(backends, tokenizer, "xgrammar", schema)
    assert not hasattr(plain, "forced_tokens")  # jump-forward walks the mask for engines without their own


def random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.choice(["object", "object", "array", "int", "str"] if depth < 3 else ["int", "str", "bool"])
    if kind == "object":
        names = rng.sample(["a", "b", "ab", "ba", "a b", "ä", "key", "k\\n"], rng.randint(0, 5))
        return {name: random_value(rng, depth + 1) for name in names}
    if kind == "array":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.randint(-5, 99) if kind == "int" else rng.choice(["x", "a", "", "q\"z"]) if kind == "str" else True


@pytest.mark.parametrize("memory", ["served", "python"])
@pytest.mark.parametrize("engine", ENGINES)
def test_random_objects_cut_anywhere(backends, tokenizer, engine: str, memory: str) -> None:  # type: ignore[no-untyped-def]
    """Random objects (keys from a small set, so repeats are near) cut at random tokens: the memory bans exactly the
    tokens that would complete a key twice, and the object's own next token is never among them."""
    rng = random.Random(56)
    cuts = 0
    for _ in range(12):
        document = {"root": random_value(rng, 0), **{k: random_value(rng, 1) for k in rng.sample("abcde", 3)}}
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        matcher = keyed_matcher(backends, tokenizer, engine, NESTED if engine == "xgrammar" else FREE, memory)
        points = sorted(rng.sample(range(1, len(ids)), min(4, len(ids) - 1)))
        done = 0
        for point in points:
            for token in ids[done:point]:
                assert matcher.advance(token)
            done = point
            check_exact(matcher, tokenizer, ids[:point])
            assert bool(allowed(matcher, len(tokenizer))[ids[point]]), "the document's own next token is allowed"
            cuts += 1
        matcher.rollback(done)  # all the way back, then once more to the end: the same answers
        for token in ids:
            assert matcher.advance(token)
    assert cuts >= 40


@pytest.mark.parametrize(("schema", "written", "ending"), [
    ({"type": "object", "patternProperties": {"^item_[a-z]+$": {"type": "integer"}}, "additionalProperties": False},
     '{"item_a":1,"item_a', 'a":0}'),  # "item_a" again is refused: one more letter
    ({"type": "object", "additionalProperties": {"type": "integer"}}, '{"k":1,"k', 'a":0}'),
    ({"type": "object", "patternProperties": {"^k[0-9]$": {"type": "integer"}}, "minProperties": 3,
      "additionalProperties": False}, '{"k0":1', ',"k1":0,"k2":0}'),  # names made up to reach minProperties
])
def test_the_closer_never_ends_with_a_key_written_already(schema: Any, written: str, ending: str) -> None:
    from proctor.constraints.json_schema import JsonCloser

    closer = JsonCloser(schema)
    closer.push(written)
    assert closer.endings()[0] == ending


@pytest.fixture(scope="module")
def compiler(tokenizer, default_model_dir):  # type: ignore[no-untyped-def]
    from proctor.constraints.compiler import ConstraintCompiler

    built = ConstraintCompiler(tokenizer=tokenizer, model_path=str(default_model_dir), vocab_size=len(tokenizer),
                               eos_token_ids=(tokenizer.eos_token_id,), tokenizer_fingerprint="t", isolate=False)
    yield built
    built.close()


@pytest.mark.parametrize(("schema", "written", "refused"), [
    # minProperties 2: after one member the brace is refused (the engine counts), and "a" again is refused (the
    # memory), so the count is of distinct keys
    ({"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}}, '{"a":1', "}"),
    ({"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}}, '{"a":1,"a', '"'),
    ({"type": "object", "patternProperties": {"^k": {"type": "integer"}}, "minProperties": 2,
      "additionalProperties": False}, '{"k":1,"k', '"'),
    ({"type": "object", "maxProperties": 2, "additionalProperties": {"type": "integer"}}, '{"a":1,"b":2', ","),
    ({"type": "object", "propertyNames": {"enum": ["ab", "cd"]}}, '{"', "x"),  # names as they are written
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": {"type": "integer"}},
     '{"a', "1"),
    ({"type": "object", "propertyNames": {"maxLength": 2}}, '{"ab', "c"),
    ({"type": "object", "propertyNames": {"const": "a"}}, '{"', "b"),
    ({"type": "object", "propertyNames": {"const": "a"}}, '{"a":1', ","),  # its one name is written: no more
    # patterns that admit a few names: listed, so after the last no member can start (a key the memory would refuse
    # at every ending: a dead end)
    ({"type": "object", "patternProperties": {"^(a|b)$": {"type": "integer"}}, "additionalProperties": False},
     '{"a":1,"b":2', ","),
])
def test_each_keyword_is_exact_through_the_compiler(compiler, tokenizer, schema: Any, written: str,  # type: ignore[no-untyped-def]
                                                    refused: str) -> None:
    result = compiler.compile(ConstraintSpec.json_schema(schema))
    assert result.exact and result.backend == "llguidance"
    matcher = result.compiled.new_matcher()
    for token in tokenizer.encode(written, add_special_tokens=False):
        assert matcher.advance(token), written
    mask = allowed(matcher, len(tokenizer))
    token = tokenizer.convert_tokens_to_ids(refused)
    assert not bool(mask[token]), (written, refused)


def test_a_required_member_stays_reachable_under_max_properties(compiler, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """maxProperties 2 with "c" required: after one optional member, only "c" may follow (AUTO serves it exactly
    with the engine that counts so; llguidance refuses max/minProperties beside optional listed keys)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                               "c": {"type": "integer"}},
              "required": ["c"], "maxProperties": 2}
    result = compiler.compile(ConstraintSpec.json_schema(schema))
    assert result.exact
    matcher = result.compiled.new_matcher()
    for token in tokenizer.encode('{"a":1,"', add_special_tokens=False):
        assert matcher.advance(token)
    mask = allowed(matcher, len(tokenizer))
    assert bool(mask[tokenizer.convert_tokens_to_ids("c")])
    assert not bool(mask[tokenizer.convert_tokens_to_ids("b")])  # "b" would leave no room for the required "c"
