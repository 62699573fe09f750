"""A thinking model's section in the engine (issue 56), with tiny random-weight thinking models of both shapes:
the constraint starts after the thought, the thought budget forces the end marker, the output budget ends a long
thought in time for the answer to close valid, and the thought comes apart from the answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.engine import Collector, tiny_settings, with_constraints
from helpers.thinking import thinking_loaded

from proctor.domain import (
    ChatMessage,
    ConstraintRequest,
    FinishReason,
    GenerationRequest,
    RequestValidationError,
    SamplingParams,
    StoppingParams,
)
from proctor.domain.reasoning import ReasoningParams

CONTEXT = 1024
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "rank": {"type": "integer"}},
          "required": ["city", "rank"], "additionalProperties": False}


@pytest.fixture(scope="module", params=["model_opens", "template_opens"])
def loaded(request: pytest.FixtureRequest, default_model_dir: Path) -> Any:
    return thinking_loaded(default_model_dir, request.param, CONTEXT)


@pytest.fixture
def engine(loaded: Any, default_model_dir: Path) -> Any:
    from proctor.engine.engine import Engine

    engine = with_constraints(Engine(loaded, tiny_settings()), loaded, default_model_dir)
    yield engine
    engine.shutdown(grace_s=1.0)


def run(engine: Any, **fields: Any) -> Collector:
    fields.setdefault("messages", (ChatMessage("user", "Name a city and its rank."),))
    request = GenerationRequest(request_id=f"r{id(fields)}", **fields)
    sink = Collector()
    engine.submit(engine.prepare(request), sink)
    sink.wait(120)
    assert sink.final.error is None, sink.final.error
    return sink


def markers(engine: Any) -> tuple[int, int]:
    found = engine.thought_markers
    assert found is not None, "auto found no thinking section in the test model"
    return found.start_id, found.end_id


def test_auto_names_the_parser_by_who_opens_the_section(engine: Any, loaded: Any) -> None:
    expected = "deepseek_r1" if loaded.model_id.endswith("template_opens") else "qwen3"
    assert engine.thought_markers.parser == expected


def test_the_thought_budget_forces_the_end_marker_and_the_answer_follows_the_schema(engine: Any) -> None:
    start, end = markers(engine)
    sink = run(engine, constraint=ConstraintRequest("json_schema", json.dumps(SCHEMA)),
               reasoning=ReasoningParams(max_tokens=6), sampling=SamplingParams(temperature=1.0, seed=3),
               stopping=StoppingParams(max_new_tokens=200))
    ids = sink.token_ids
    assert end in ids
    at = ids.index(end)
    section = ids[:at + 1]
    own = [t for t in section if t not in (start, end)]
    assert len(own) == 6  # the budget, exactly: the end marker was forced after six thought tokens
    assert sink.final.usage.reasoning_tokens == len(section)
    assert "</think>" not in sink.text and "<think>" not in sink.text
    answer = json.loads(sink.text)
    assert set(answer) == {"city", "rank"}
    assert sink.final.schema_check is not None and sink.final.schema_check.valid
    reasoning = "".join(e.reasoning for e in sink.events)
    assert "think>" not in reasoning


def test_a_long_thought_is_ended_in_time_for_the_answer_to_close_valid(engine: Any) -> None:
    sink = run(engine, constraint=ConstraintRequest("json_schema", json.dumps(SCHEMA)),
               sampling=SamplingParams(temperature=1.0, seed=5), stopping=StoppingParams(max_new_tokens=40))
    assert sink.final.finish_reason in (FinishReason.CLOSED_AT_BUDGET, FinishReason.CONSTRAINT_COMPLETE,
                                        FinishReason.EOS)
    assert len(sink.token_ids) <= 40
    assert sink.final.usage.reasoning_tokens > 0
    assert json.loads(sink.text).keys() == {"city", "rank"}


def test_a_budget_that_cannot_hold_the_markers_and_the_answer_is_refused_naming_the_field(engine: Any) -> None:
    request = GenerationRequest(request_id="short", messages=(ChatMessage("user", "x"),),
                                constraint=ConstraintRequest("json_schema", json.dumps(SCHEMA)),
                                stopping=StoppingParams(max_new_tokens=8))
    with pytest.raises(RequestValidationError) as caught:
        engine.prepare(request)
    assert caught.value.violations[0].field == "stopping.max_new_tokens"
    assert "marker" in caught.value.violations[0].description


def test_reasoning_off_answers_at_once(engine: Any, loaded: Any) -> None:
    start, end = markers(engine)
    sink = run(engine, constraint=ConstraintRequest("json_schema", json.dumps(SCHEMA)),
               reasoning=ReasoningParams(enabled=False), stopping=StoppingParams(max_new_tokens=120))
    ids = sink.token_ids
    assert start not in ids
    if loaded.model_id.endswith("template_opens"):  # the template opened it: closed at once, empty
        assert ids[0] == end and sink.final.usage.reasoning_tokens == 1
    else:
        assert end not in ids and sink.final.usage.reasoning_tokens == 0
    assert json.loads(sink.text).keys() == {"city", "rank"}


def test_an_unconstrained_thought_is_apart_from_the_answer(engine: Any) -> None:
    start, end = markers(engine)
    sink = run(engine, reasoning=ReasoningParams(max_tokens=5),
               stopping=StoppingParams(max_new_tokens=12, ignore_eos=True))
    ids = sink.token_ids
    at = ids.index(end)
    assert sink.final.usage.reasoning_tokens == at + 1
    tokenizer = engine.loaded.tokenizer
    answer = tokenizer.decode(ids[at + 1:], skip_special_tokens=True)
    assert sink.text == answer
    thought = tokenizer.decode([t for t in ids[:at] if t != start], skip_special_tokens=True)
    assert "".join(e.reasoning for e in sink.events) == thought


def test_template_kwargs_the_template_cannot_take_are_refused_naming_them(engine: Any) -> None:
    request = GenerationRequest(request_id="kw", messages=(ChatMessage("user", "x"),),
                                chat_template_kwargs=json.dumps({"no_such_switch": True}))
    with pytest.raises(RequestValidationError) as caught:
        engine.prepare(request)
    assert caught.value.violations[0].field == "chat_template_kwargs.no_such_switch"


def test_the_same_seed_gives_the_same_thought_and_answer(engine: Any) -> None:
    fields: dict[str, Any] = {"constraint": ConstraintRequest("json_schema", json.dumps(SCHEMA)),
                              "sampling": SamplingParams(temperature=1.0, seed=11),
                              "reasoning": ReasoningParams(max_tokens=10),
                              "stopping": StoppingParams(max_new_tokens=80)}
    first, second = run(engine, **fields), run(engine, **fields)
    assert first.token_ids == second.token_ids


def test_beam_search_is_refused_on_a_thinking_section_naming_the_field(engine: Any) -> None:
    request = GenerationRequest(request_id="beams", messages=(ChatMessage("user", "x"),),
                                sampling=SamplingParams(num_beams=2), stopping=StoppingParams(max_new_tokens=8))
    with pytest.raises(RequestValidationError) as caught:
        engine.prepare(request)
    assert caught.value.violations[0].field == "sampling.num_beams"
