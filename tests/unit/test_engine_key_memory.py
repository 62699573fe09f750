"""Issue 56's object shapes end to end in the engine (tiny random-weight model, real tokenizer, engines in-process):
served exactly (``constraint.exact``, the keywords the key memory moved named), every output valid, no key twice.

The tiny model writes near-random keys at temperature 1.0, so it tries keys again far more often than a trained one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.engine import Collector

from proctor.constraints.compiler import ConstraintCompiler
from proctor.constraints.service import ConstraintService
from proctor.domain import ConstraintRequest, GenerationRequest, SamplingParams, StoppingParams

SEEDS = range(6)
SHAPES: list[tuple[dict[str, Any], tuple[str, ...]]] = [
    ({"type": "object", "propertyNames": {"enum": ["alpha", "beta", "gamma", "delta"]},
      "additionalProperties": {"type": "integer"}}, ("propertyNames at #",)),
    ({"type": "object", "patternProperties": {"^k[a-z0-9]*$": {"type": "integer"}}, "minProperties": 4,
      "additionalProperties": False}, ("minProperties at #",)),
    ({"type": "object", "minProperties": 5, "additionalProperties": {"type": "integer"}}, ("minProperties at #",)),
    ({"type": "object", "additionalProperties": {"type": "object", "additionalProperties": {"type": "integer"}}}, ()),
]


@pytest.fixture
def engine(make_engine, tiny_loaded, default_model_dir: Path):  # type: ignore[no-untyped-def]
    compiler = ConstraintCompiler(tokenizer=tiny_loaded.tokenizer, model_path=str(default_model_dir),
                                  vocab_size=tiny_loaded.vocab_size, eos_token_ids=tiny_loaded.eos_token_ids,
                                  tokenizer_fingerprint="tiny", isolate=False)
    engine = make_engine(start=False)
    engine.constraints = ConstraintService(compiler)
    engine.start()
    return engine


def no_key_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"a key twice: {keys}"
    return dict(pairs)


@pytest.mark.parametrize(("schema", "remembered"), SHAPES)
def test_each_shape_is_exact_and_every_output_valid(engine, schema: dict[str, Any],  # type: ignore[no-untyped-def]
                                                    remembered: tuple[str, ...]) -> None:
    for seed in SEEDS:
        request = GenerationRequest(
            f"r{seed}", prompt="JSON:", sampling=SamplingParams(temperature=1.0, seed=seed),
            stopping=StoppingParams(max_new_tokens=160),
            constraint=ConstraintRequest("json_schema", text=json.dumps(schema)))
        sink = Collector()
        engine.submit(engine.prepare(request), sink)
        events = sink.wait(120)
        final = events[-1]
        assert final.constraint is not None and final.constraint.exact and not final.constraint.relaxed
        assert final.constraint.remembered == remembered
        text = "".join(event.text for event in events)
        json.loads(text, object_pairs_hook=no_key_twice)
        assert final.schema_check is not None and final.schema_check.valid, (seed, text, final.schema_check.errors)
