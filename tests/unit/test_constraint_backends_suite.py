"""The JSON Schema Test Suite (draft 2020-12) through each engine behind the soundness guard.

For every schema an engine accepts, no instance the suite marks invalid may pass (in any of its
compact spellings: key order as written or sorted, non-ASCII raw or escaped). Before the guard the
same sweep found 691 invalid instances passing xgrammar, 42 passing llguidance (calendar formats,
ECMA regex classes, \\u-escaped keys) and 20 passing outlines (which refuses much by itself).
This is the regression test for the guard and the pattern translation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.requirements import BENCHDATA, missing

from proctor.constraints.backends import create_backend
from proctor.constraints.errors import ConstraintError
from proctor.constraints.spec import ConstraintSpec

pytestmark = pytest.mark.real_model

SUITE = BENCHDATA / "json-schema-test-suite" / "tests" / "draft2020-12"
# outlines-core takes minutes to index an unconstrained array-or-object (4.5 min each measured).
SLOW = {("outlines", "type.json", "type: array or object"), ("outlines", "type.json", "type: array, object or null")}


def suite_files() -> list[Path]:
    if not SUITE.is_dir():
        return []
    return [path for pattern in ("*.json", "optional/*.json", "optional/format/*.json")
            for path in sorted(SUITE.glob(pattern))]


def spellings(data: object) -> set[str]:
    return {json.dumps(data, separators=(",", ":"), sort_keys=sort, ensure_ascii=ascii_only)
            for sort in (False, True) for ascii_only in (False, True)}


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance", "outlines"])
def test_no_invalid_instance_passes_a_guarded_schema(tokenizer, engine: str) -> None:  # type: ignore[no-untyped-def]
    files = suite_files()
    if not files:
        missing(f"the JSON Schema Test Suite is not at {SUITE}")
    backend = create_backend(engine, tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    leaks, compiled_groups = [], 0
    for path in files:
        name = str(path.relative_to(SUITE))
        for group in json.loads(path.read_text(encoding="utf-8")):
            if (engine, name, group["description"]) in SLOW:
                continue
            try:
                compiled = backend.compile(ConstraintSpec.json_schema(group["schema"]))
            except ConstraintError:
                continue
            compiled_groups += 1
            for test in group["tests"]:
                if test["valid"]:
                    continue
                for text in spellings(test["data"]):
                    matcher = compiled.new_matcher()
                    ids = tokenizer.encode(text, add_special_tokens=False)
                    if all(matcher.advance(token) for token in ids) and matcher.can_end():
                        leaks.append(f"{name} / {group['description']} / {test['description']}: {text}")
    assert compiled_groups > 50
    assert not leaks, "\n".join(leaks)


MASKBENCH = BENCHDATA / "maskbench"
MASKBENCH_SAMPLE = 240  # schemas, spread over the splits by a hash of the name (the same ones every run)


def maskbench_sample() -> list[dict]:
    import hashlib

    if not MASKBENCH.is_dir():
        missing(f"MaskBench is not at {MASKBENCH}")
    paths = sorted(MASKBENCH.glob("*.json"), key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())
    return [json.loads(p.read_text(encoding="utf-8")) | {"name": p.name} for p in paths[:MASKBENCH_SAMPLE]]


def accepts(compiled, tokenizer, text: str) -> bool:  # type: ignore[no-untyped-def]
    matcher = compiled.new_matcher()
    return all(matcher.advance(t) for t in tokenizer.encode(text, add_special_tokens=False)) and matcher.can_end()


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance", "fallback"])
def test_no_invalid_maskbench_instance_is_served(tokenizer, engine: str) -> None:  # type: ignore[no-untyped-def]
    """Exact engines: the mask rejects every invalid instance. The fallback: the relaxed mask or the
    server's validator does (an invalid instance is never returned as valid)."""
    from proctor.constraints.compiler import compile_relaxed
    from proctor.constraints.json_schema.validation import validate_json_output

    inner = "llguidance" if engine == "fallback" else engine
    backend = create_backend(inner, tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    leaks, compiled_count = [], 0
    for item in maskbench_sample():
        spec = ConstraintSpec.json_schema(item["schema"])
        try:
            compiled = (compile_relaxed(spec, inner, backend.compile)[0] if engine == "fallback"
                        else backend.compile(spec))
        except ConstraintError:
            continue
        compiled_count += 1
        for test in item["tests"]:
            if test["valid"]:
                continue
            text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
            served = accepts(compiled, tokenizer, text) and (
                engine != "fallback" or validate_json_output(text, item["schema"], truncated=False).valid)
            if served:
                leaks.append(f"{item['name']}: {text[:100]}")
    assert compiled_count > MASKBENCH_SAMPLE // 2
    assert not leaks, "\n".join(leaks)
