"""Flexible JSON whitespace is capped (issue 45): a run of at most ``MAX_JSON_WHITESPACE`` characters between two JSON
tokens, on every engine, so a model cannot spend its budget on spaces and newlines."""

from __future__ import annotations

import pytest
from test_constraint_backends_suite import accepts

from proctor.constraints.backends import create_backend
from proctor.constraints.spec import MAX_JSON_WHITESPACE, ConstraintSpec

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
LONGEST = {"xgrammar": MAX_JSON_WHITESPACE, "llguidance": MAX_JSON_WHITESPACE, "outlines": 1}  # outlines': `[ ]?`


@pytest.mark.parametrize("engine", sorted(LONGEST))
def test_a_run_of_whitespace_longer_than_the_cap_is_refused_by_the_mask(tokenizer, engine: str) -> None:  # type: ignore[no-untyped-def]
    backend = create_backend(engine, tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    compiled = backend.compile(ConstraintSpec.json_schema(SCHEMA, flexible_whitespace=True))
    longest = LONGEST[engine]
    assert accepts(compiled, tokenizer, '{"a":1}')
    assert accepts(compiled, tokenizer, "{" + " " * longest + '"a":1}')
    assert not accepts(compiled, tokenizer, "{" + " " * (longest + 1) + '"a":1}')
    if longest > 1:
        assert accepts(compiled, tokenizer, '{\n  "a": 1\n}')  # pretty-printed JSON still fits
        assert not accepts(compiled, tokenizer, '{"a":1' + "\n" * (longest + 1) + "}")
