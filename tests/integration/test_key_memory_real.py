"""Issue 56 with the real model: objects whose keys the mask remembers, served exactly, every output valid.

The three shapes the issue measured at temperature 1.0 (0/12, 4/12 and 9/12 valid on the validated fallback before),
each over many seeds at 160 tokens: each answer must say ``constraint.exact`` with the keyword the key memory moved,
parse with no key twice, and validate.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from proctor_client import ProctorClient

pytestmark = pytest.mark.real_model

SEEDS = range(12)
PROMPT = [("system", "You answer in JSON."), ("user", "Give a small JSON map of things to their counts.")]
SHAPES: dict[str, tuple[dict[str, Any], str]] = {
    "propertyNames enum": ({"type": "object", "propertyNames": {"enum": ["apples", "pears", "plums", "figs"]},
                            "additionalProperties": {"type": "integer"}}, "propertyNames at #"),
    "patternProperties, minProperties 4": ({"type": "object", "patternProperties": {"^item_[a-z]+$": {
        "type": "integer"}}, "minProperties": 4, "additionalProperties": False}, "minProperties at #"),
    "free map, minProperties 5": ({"type": "object", "minProperties": 5, "additionalProperties": {"type": "integer"}},
                                  "minProperties at #"),
}


def no_key_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"a key twice: {keys}"
    return dict(pairs)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_shape_is_exact_and_valid_at_every_seed(client: ProctorClient, shape: str) -> None:
    schema, remembered = SHAPES[shape]
    for seed in SEEDS:
        response = client.generate(messages=PROMPT, json_schema=json.dumps(schema), temperature=1.0, seed=seed,
                                   max_new_tokens=160, timeout_s=300)
        assert response.constraint.exact and not response.constraint.relaxed_keywords, seed
        assert list(response.constraint.remembered_keywords) == [remembered]
        assert len(response.attempts) <= 1  # no validated fallback: one generation
        json.loads(response.text, object_pairs_hook=no_key_twice)
        assert response.schema_validation.valid, (seed, response.text, list(response.schema_validation.errors))
