"""The validated fallback end to end in the engine (tiny model, real tokenizer, llguidance in-process).

A schema no engine enforces exactly runs as attempts: each one under the relaxed mask, validated
against the full schema, retried within ``fallback_attempts``; the final event lists every attempt
and never calls an invalid output valid.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.engine import Collector

from proctor.constraints.compiler import ConstraintCompiler
from proctor.constraints.service import ConstraintService
from proctor.domain import ConstraintRequest, GenerationRequest, SamplingParams, StoppingParams
from proctor.engine.attempts import attempt_seed

BUDGET = 3


def build(make_engine, tiny_loaded, model_dir: Path):  # type: ignore[no-untyped-def]
    """A tiny-model engine with constraints compiled in-process (not started)."""
    compiler = ConstraintCompiler(tokenizer=tiny_loaded.tokenizer, model_path=str(model_dir),
                                  vocab_size=tiny_loaded.vocab_size, eos_token_ids=tiny_loaded.eos_token_ids,
                                  tokenizer_fingerprint="tiny", isolate=False)
    engine = make_engine(start=False, fallback_attempts=BUDGET)
    engine.constraints = ConstraintService(compiler)
    return engine


@pytest.fixture
def engine(make_engine, tiny_loaded, default_model_dir: Path):  # type: ignore[no-untyped-def]
    engine = build(make_engine, tiny_loaded, default_model_dir)
    engine.start()
    return engine


def run(engine, schema: object, *, seed: int = 11, temperature: float | None = None,  # type: ignore[no-untyped-def]
        exact_only: bool = False, request_id: str = "r"):
    request = GenerationRequest(
        request_id, prompt="JSON:", sampling=SamplingParams(temperature=temperature, seed=seed),
        stopping=StoppingParams(max_new_tokens=24),
        constraint=ConstraintRequest("json_schema", text=json.dumps(schema), exact_only=exact_only))
    sink = Collector()
    engine.submit(engine.prepare(request), sink)
    return sink.wait(120)


def test_an_output_the_relaxed_mask_cannot_make_valid_is_never_called_valid(engine) -> None:  # type: ignore[no-untyped-def]
    # The mask enforces {"type": "boolean"}; `not` (relaxed: no engine enforces it) rejects every boolean.
    events = run(engine, {"type": "boolean", "not": {"enum": [True, False]}})
    final = events[-1]
    assert final.constraint is not None and not final.constraint.exact
    assert final.constraint.relaxed == ("not at #",)
    assert final.schema_check is not None and not final.schema_check.valid
    assert [a.number for a in final.attempts] == [1, 2, 3] and not any(a.valid for a in final.attempts)
    assert "no valid output in 3 attempts" in final.finish_detail
    # Attempt 1 is the request as asked (greedy, its seed); retries sample with derived seeds.
    assert final.attempts[0].temperature == 0 and final.attempts[0].seed == 11
    assert final.attempts[1].temperature > 0 and final.attempts[1].seed == attempt_seed(11, 2) != 11
    assert final.seed == 11  # the request's seed: replaying the record runs the same attempts
    assert "".join(e.text for e in events) in ("true", "false")


def test_a_valid_first_attempt_is_returned_at_once(engine) -> None:  # type: ignore[no-untyped-def]
    events = run(engine, {"type": "boolean", "not": {"enum": ["x"]}})
    final = events[-1]
    assert final.schema_check is not None and final.schema_check.valid
    assert len(final.attempts) == 1 and final.attempts[0].valid
    assert "no valid output" not in final.finish_detail


def test_attempts_are_deterministic_and_stop_at_the_first_valid_one(engine) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 3, "maxItems": 3, "uniqueItems": True}
    first = run(engine, schema, seed=5, temperature=1.0, request_id="a")
    again = run(engine, schema, seed=5, temperature=1.0, request_id="b")
    final = first[-1]
    text = "".join(e.text for e in first)
    assert text == "".join(e.text for e in again) and final.attempts == again[-1].attempts
    assert final.attempts[-1].valid == final.schema_check.valid  # type: ignore[union-attr]
    values = json.loads(text)
    assert len(values) == 3 and set(values) <= {1, 2, 3}
    assert final.schema_check.valid == (len(set(values)) == 3)  # type: ignore[union-attr]
    assert all(not a.valid for a in final.attempts[:-1])  # it stopped at the first valid one


def test_exact_only_refuses_instead(engine) -> None:  # type: ignore[no-untyped-def]
    from proctor.domain import RequestValidationError

    with pytest.raises(RequestValidationError) as caught:
        run(engine, {"type": "array", "uniqueItems": True}, exact_only=True)
    assert "uniqueItems" in str(caught.value)


def test_an_exact_schema_runs_once_without_attempts(engine) -> None:  # type: ignore[no-untyped-def]
    final = run(engine, {"type": "boolean"})[-1]
    assert final.constraint is not None and final.constraint.exact and final.attempts == ()


def test_a_cancel_between_two_attempts_starts_no_other() -> None:
    """FallbackAttempts alone: the engine's start is a recorder here, events are handed in directly."""
    from proctor.domain import FinishReason, SchemaCheck, TokenEvent
    from proctor.domain.events import Usage
    from proctor.domain.output_budget import OutputBudget
    from proctor.engine.attempts import FallbackAttempts
    from proctor.engine.preprocess import PreparedRequest

    launches, released, done = [], [], []
    request = GenerationRequest("r", prompt="x", sampling=SamplingParams(seed=3))
    prepared = PreparedRequest(request=request, prompt_ids=(1,), output_budget=OutputBudget(4))
    attempts = FallbackAttempts(prepared, 3, released.append, most_attempts=3, retry_temperature=0.7,
                                start=lambda p, seed, sink, created: launches.append((p, seed, sink)),
                                on_done=lambda: done.append(True))
    attempts.begin()
    assert len(launches) == 1
    _, _, sink = launches[0]
    invalid = TokenEvent("r", (5,), "t", finish_reason=FinishReason.EOS, usage=Usage(1, 1),
                         schema_check=SchemaCheck(False, ("bad",)))
    attempts.cancelled = True
    sink(invalid)
    assert len(launches) == 1 and done == [True]
    assert released[-1].finished and "cancelled before a retry" in released[-1].finish_detail
    assert [a.number for a in released[-1].attempts] == [1]


def test_a_request_id_on_the_fallback_cannot_be_reused_while_it_runs(  # type: ignore[no-untyped-def]
        make_engine, tiny_loaded, default_model_dir: Path) -> None:
    from proctor.domain import RequestValidationError

    engine = build(make_engine, tiny_loaded, default_model_dir)  # started below: the first is still queued

    schema = {"type": "boolean", "not": {"enum": [True, False]}}  # every attempt is invalid: 3 of them
    request = GenerationRequest(
        "same", prompt="JSON:", sampling=SamplingParams(seed=1), stopping=StoppingParams(max_new_tokens=4),
        constraint=ConstraintRequest("json_schema", text=json.dumps(schema)))
    first = Collector()
    engine.submit(engine.prepare(request), first)
    with pytest.raises(RequestValidationError, match="already running"):
        engine.submit(engine.prepare(request), Collector())
    engine.start()
    assert len(first.wait(120)[-1].attempts) == BUDGET
    engine.submit(engine.prepare(request), Collector())  # free again once it ended
