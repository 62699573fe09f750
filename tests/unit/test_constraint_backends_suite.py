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

from proctor.constraints.backend import ConstraintError
from proctor.constraints.backends import create_backend
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
