"""The compiled key memory (constraints/key_memory/keys.cpp) gives layer.py's answers, token by token.

The compiled memory serves wherever it builds (the mask's cost, issue 56); the Python one is the reference it is
held to: at every token of random documents (escaped keys, characters outside ASCII cut between tokens, keys at
every depth) both ban the same tokens and hold the same keys, through rollbacks and forks. That the answers are
right at all is test_key_memory.py's (against a scanner of its own), run on the compiled memory.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from helpers.requirements import missing

from proctor.constraints.key_memory import KeyMemory, key_vocabulary
from proctor.constraints.key_memory.native import native_memory, native_module
from proctor.constraints.key_memory.vocabulary import KeyVocabulary

NAMES = ["a", "b", "ab", "ba", "a b", "ä", "ää", "日本", "key", "k\n", "k\\", 'q"', "é", "e\u0301", "😀", ",", ":", ""]


@pytest.fixture(scope="module")
def compiled_memory(tokenizer):  # type: ignore[no-untyped-def]
    maker = native_memory(tokenizer, len(tokenizer))
    if maker is None:
        missing("the compiled key memory could not be built here (a C++ compiler and ninja are needed)")
    return maker


def python_memory(tokenizer) -> KeyMemory:  # type: ignore[no-untyped-def]
    return KeyMemory(key_vocabulary(tokenizer, len(tokenizer)), {})


def random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.choice(["object", "object", "array", "int", "str", "float"] if depth < 4 else ["int", "str", "null"])
    if kind == "object":
        return {name: random_value(rng, depth + 1) for name in rng.sample(NAMES, rng.randint(0, 6))}
    if kind == "array":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "int":
        return rng.randint(-50, 999)
    if kind == "float":
        return rng.choice([1.5, -0.25, 3e-7, 12345.678])
    return None if kind == "null" else rng.choice([*NAMES, 'x\\"y', "\t"])


def spellings(rng: random.Random, document: Any) -> str:
    """The document as JSON, keys and strings spelled plainly or with \\u escapes, compact or spaced."""
    return json.dumps(document, ensure_ascii=rng.random() < 0.4, indent=rng.choice([None, None, 1]),
                      separators=None if rng.random() < 0.3 else (",", ":"))


def same(native: Any, python: KeyMemory, where: str) -> None:
    assert native.banned() == python.banned(), where
    assert native.written() == python.written(), where


def test_the_compiled_memory_builds_here() -> None:
    if native_module() is None:
        missing("the compiled key memory could not be built here (a C++ compiler and ninja are needed)")


def test_the_same_answers_at_every_token(tokenizer, compiled_memory) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(5601)
    tokens = 0
    for _ in range(60):
        document = {name: random_value(rng, 1) for name in rng.sample(NAMES, 5)}
        ids = list(tokenizer.encode(spellings(rng, document), add_special_tokens=False))
        native, python = compiled_memory(), python_memory(tokenizer)
        same(native, python, "start")
        for index, token in enumerate(ids):
            native.advance(token)
            python.advance(token)
            same(native, python, repr(tokenizer.decode(ids[:index + 1])))
        tokens += len(ids)
    assert tokens > 3000


def test_the_same_answers_for_every_quote_token_after_each_prefix(tokenizer, compiled_memory) -> None:  # type: ignore[no-untyped-def]
    """Keys begun and written, then each quote token of the vocabulary as the next one: the same bans both ways,
    and some are banned (the check can fail)."""
    vocab: KeyVocabulary = key_vocabulary(tokenizer, len(tokenizer))
    banned = 0
    for prefix in ['{"a":1,"', '{"ab":1,"a', '{"a b":{"x":[1,{"y":2,"y', '{"\\u00e4":1,"', '{"ä":1,"\\u00',
                   '{"k\\n":1,"k\\', '{"日本":1,"日', '{"q\\"":"v","q\\"', '{"":1,"', '{",":1,"x":{},']:
        ids = list(tokenizer.encode(prefix, add_special_tokens=False))
        native, python = compiled_memory(), python_memory(tokenizer)
        for token in ids:
            native.advance(token)
            python.advance(token)
        same(native, python, prefix)
        banned += len(native.banned())
        for token in vocab.quoted:
            native.advance(token)
            python.advance(token)
            same(native, python, prefix + repr(vocab.texts[token]))
            native.rollback(1)
            python.rollback(1)
    assert banned > 0


def test_rollback_and_fork_keep_the_same_answers(tokenizer, compiled_memory) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(5602)
    for _ in range(20):
        document = {name: random_value(rng, 1) for name in rng.sample(NAMES, 6)}
        ids = list(tokenizer.encode(spellings(rng, document), add_special_tokens=False))
        native, python = compiled_memory(), python_memory(tokenizer)
        done = 0
        while done < len(ids):
            step = rng.randint(1, 40)
            for token in ids[done:done + step]:
                native.advance(token)
                python.advance(token)
            done = min(len(ids), done + step)
            back = rng.randint(0, min(done, 35))  # across the checkpoints (every 16 tokens)
            native.rollback(back)
            python.rollback(back)
            done -= back
            same(native, python, f"after a rollback of {back} to {done}")
            if rng.random() < 0.3:
                native, python = native.fork(), python.fork()
                same(native, python, "a fork")
            for token in ids[done:done + 3]:
                native.advance(token)
                python.advance(token)
            done = min(len(ids), done + 3)
            same(native, python, f"at {done}")


def test_the_server_serves_the_compiled_memory(tokenizer, compiled_memory) -> None:  # type: ignore[no-untyped-def]
    """Where the compiled memory builds, ``keyed`` (what the compiler wraps every JSON schema in) uses it."""
    from proctor.constraints.backends import create_backend
    from proctor.constraints.key_memory import KeyedCompiled, keyed
    from proctor.constraints.spec import ConstraintSpec

    backend = create_backend("llguidance", tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    compiled = keyed(backend.compile(ConstraintSpec.json_schema({"type": "object"})), tokenizer, len(tokenizer))
    assert isinstance(compiled, KeyedCompiled)
    assert type(compiled.new_matcher().memory) is type(compiled_memory())
    assert type(compiled_memory()).__module__ == "proctor_keys"
