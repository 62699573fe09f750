"""Valid within the budget (issue 45): a JSON-schema output running short of tokens is ended with its shortest valid
ending, in the engine (tiny random-weight model, real tokenizer, llguidance in-process).

A random-weight model rambles inside strings and arrays until the token limit, so every request here reaches its
budget: each output must come back valid (``CLOSED_AT_BUDGET``, or ended by itself), never cut off invalid.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.engine import Collector

from proctor.constraints.compiler import ConstraintCompiler
from proctor.constraints.json_validation import validate_json_output
from proctor.constraints.service import ConstraintService
from proctor.domain import (
    ConstraintRequest,
    FinishReason,
    GenerationRequest,
    RepetitionParams,
    SamplingParams,
    StoppingParams,
)

SCHEMAS: dict[str, dict] = {
    "string": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    "min_items": {"type": "object", "required": ["tags"], "properties": {
        "tags": {"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 3}}},
    "nested": {"type": "object", "required": ["party", "terms"], "properties": {
        "party": {"type": "object", "required": ["name", "address"], "properties": {
            "name": {"type": "string"}, "address": {"type": "object", "required": ["city"],
                                                    "properties": {"city": {"type": "string", "minLength": 1}}}}},
        "terms": {"type": "array", "items": {"type": "string"}}}},
    "enum": {"type": "object", "properties": {"note": {"type": "string"},
                                              "status": {"enum": ["active", "inactive", "pending"]}},
             "required": ["note", "status"]},
    "ref": {"$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 10},
                                                                "label": {"type": "string"}},
                               "required": ["id", "label"]}},
            "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}},
                                             "owner": {"$ref": "#/$defs/item"}}, "required": ["items", "owner"]},
    "pattern": {"type": "object", "properties": {"text": {"type": "string"},
                                                 "code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                "required": ["text", "code"]},
}


@pytest.fixture
def engine(make_engine, tiny_loaded, default_model_dir: Path):  # type: ignore[no-untyped-def]
    compiler = ConstraintCompiler(tokenizer=tiny_loaded.tokenizer, model_path=str(default_model_dir),
                                  vocab_size=tiny_loaded.vocab_size, eos_token_ids=tiny_loaded.eos_token_ids,
                                  tokenizer_fingerprint="tiny", isolate=False)
    built = make_engine(start=False)
    built.constraints = ConstraintService(compiler)
    built.start()
    return built


def request(schema: dict, budget: int, *, seed: int = 3, close: bool = True, flexible: bool = False,
            repetition: RepetitionParams | None = None, request_id: str = "r") -> GenerationRequest:
    return GenerationRequest(
        request_id, prompt="Fill in the record as JSON:", sampling=SamplingParams(temperature=1.0, seed=seed),
        stopping=StoppingParams(max_new_tokens=budget, close_at_budget=close, repetition=repetition),
        constraint=ConstraintRequest("json_schema", text=json.dumps(schema), flexible_whitespace=flexible))


def run(engine, generation: GenerationRequest):  # type: ignore[no-untyped-def]
    sink = Collector()
    engine.submit(engine.prepare(generation), sink)
    return sink.wait(120)


def minimum_of(engine, schema: dict) -> int:  # type: ignore[no-untyped-def]
    prepared = engine.prepare(request(schema, 512))
    assert prepared.budget is not None
    return prepared.budget.minimum


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_at_every_budget_from_the_minimum_up_the_output_is_valid(engine, name: str) -> None:  # type: ignore[no-untyped-def]
    schema = SCHEMAS[name]
    minimum = minimum_of(engine, schema)
    assert minimum > 0, "the schema's shortest valid output is known"
    closed = 0
    for budget in sorted({minimum, minimum + 1, minimum + 4, 2 * minimum + 3, 64}):
        for seed in (1, 2):
            events = run(engine, request(schema, budget, seed=seed))
            final = events[-1]
            text = "".join(event.text for event in events)
            assert final.finish_reason is not FinishReason.LENGTH, (budget, seed, text)
            assert validate_json_output(text, schema, truncated=False).valid, (budget, seed, text)
            assert final.schema_check is not None and final.schema_check.valid
            assert final.usage is not None and final.usage.completion_tokens <= budget
            if final.finish_reason is FinishReason.CLOSED_AT_BUDGET:
                closed += 1
                assert 0 < final.usage.closing_tokens <= final.usage.completion_tokens
                assert "closed at the budget" in final.finish_detail
    assert closed, "the budget rule closed some of them (a random model never ends a JSON by itself)"
