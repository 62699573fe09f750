"""A batch's constraint masks filled together (constraints/backend.fill_bitmasks).

llguidance rows are filled on llguidance's own threads in one call; that must give every row the
mask it gets alone, whatever state each row's matcher is in, and leave rows without a matcher (and
rows of other engines, filled one by one) as they were or as their own matcher writes them.
"""

from __future__ import annotations

import pytest
import torch

from proctor.constraints.backend import allocate_bitmask, fill_bitmasks
from proctor.constraints.backends import create_backend
from proctor.constraints.spec import ConstraintSpec

pytestmark = pytest.mark.real_model

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
          "required": ["name", "age", "tags"]}
PREFIXES = ['', '{"', '{"name":"Ac', '{"name":"Acme","age":4', '{"name":"x","age":1,"tags":["a"']


def test_masks_filled_together_equal_masks_filled_one_by_one(tokenizer) -> None:  # type: ignore[no-untyped-def]
    vocab, eos = len(tokenizer), (tokenizer.eos_token_id,)
    llguidance = create_backend("llguidance", tokenizer, vocab, eos).compile(ConstraintSpec.json_schema(SCHEMA))
    xgrammar = create_backend("xgrammar", tokenizer, vocab, eos).compile(ConstraintSpec.regex("[0-9]{1,3}"))
    matchers = []
    for prefix in PREFIXES:
        matcher = llguidance.new_matcher()
        for token in tokenizer.encode(prefix, add_special_tokens=False):
            assert matcher.advance(token), prefix
        matchers.append(matcher)
    matchers.append(xgrammar.new_matcher())
    rows = len(matchers) + 1  # the last row has no matcher
    alone = allocate_bitmask(rows, vocab)
    for row, matcher in enumerate(matchers):
        matcher.fill_bitmask(alone, row)
    together = allocate_bitmask(rows, vocab)
    fill_bitmasks(together, [(m, r) for r, m in enumerate(matchers)])
    assert torch.equal(alone, together)
    assert (together[-1] == -1).all(), "a row without a matcher was written"
    assert len({tuple(row.tolist()) for row in together[:len(PREFIXES)]}) == len(PREFIXES), "states not distinct"
