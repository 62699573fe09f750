"""Forbidden phrases, logit bias, allowed ids, the repetition stop and plugins, through the engine
(tiny random-weight model with the real tokenizer; the real model runs in tests/integration)."""

from __future__ import annotations

import uuid

import pytest
from helpers.engine import Collector, tiny_settings
from helpers.oracles import contains_phrase

from proctor.domain import (
    FinishReason,
    ForbiddenParams,
    GenerationRequest,
    PluginCall,
    RepetitionParams,
    RequestValidationError,
    StoppingParams,
)
from proctor.engine.engine import Engine

PROMPT = "Once upon a time, in a small village by the sea, there lived"


def request(n: int = 24, **fields: object) -> GenerationRequest:
    stopping = fields.pop("stopping", StoppingParams(max_new_tokens=n, ignore_eos=True))
    return GenerationRequest(request_id=uuid.uuid4().hex, prompt=PROMPT, stopping=stopping,  # type: ignore[arg-type]
                             token_details=True, **fields)  # type: ignore[arg-type]


def run(engine: Engine, req: GenerationRequest) -> Collector:
    sink = Collector()
    engine.submit(engine.prepare(req), sink)
    sink.wait(60)
    return sink


@pytest.fixture
def engine(tiny_loaded):  # type: ignore[no-untyped-def]
    engines: list[Engine] = []

    def make(**kwargs: object) -> Engine:
        built = Engine(tiny_loaded, tiny_settings(), **kwargs)  # type: ignore[arg-type]
        built.start()
        engines.append(built)
        return built

    yield make
    for built in engines:
        built.shutdown(grace_s=0.5)


def a_phrase_of(text: str) -> str:
    """A phrase the unconstrained output contains: a run of letters from its middle."""
    words = [w for w in text.split() if sum(ch.isalpha() for ch in w) >= 3]
    assert words, f"the tiny model's output has no word to forbid: {text!r}"
    return "".join(ch for ch in words[len(words) // 2] if ch.isalpha())[:6]


def test_a_forbidden_phrase_from_the_free_output_disappears(engine) -> None:  # type: ignore[no-untyped-def]
    eng = engine()
    free = run(eng, request())
    phrase = a_phrase_of(free.text)
    assert contains_phrase(phrase, free.text)
    banned = run(eng, request(forbidden=ForbiddenParams((phrase.upper(),))))
    assert not contains_phrase(phrase, banned.text), (phrase, banned.text)
    removed = [d.removed_by for e in banned.events for d in e.details]
    assert "forbidden" in removed
    assert banned.final.finish_reason is FinishReason.LENGTH


def test_the_server_wide_list_is_always_merged(engine) -> None:  # type: ignore[no-untyped-def]
    free = run(engine(), request())
    phrase = a_phrase_of(free.text)
    assert contains_phrase(phrase, free.text)
    out = run(engine(server_forbidden=(phrase,)), request(forbidden=ForbiddenParams(("unrelated",))))
    assert not contains_phrase(phrase, out.text)


def test_logit_bias_removes_the_top_choice(engine) -> None:  # type: ignore[no-untyped-def]
    eng = engine()
    first = run(eng, request(2)).token_ids[0]
    out = run(eng, request(2, logit_bias=((first, -100.0),)))
    assert out.token_ids[0] != first
    assert out.events[0].details[0].removed_by == "logit_bias"
    forced = run(eng, request(3, logit_bias=((1234, 100.0),)))
    assert forced.token_ids == [1234, 1234, 1234]


def test_allowed_token_ids_limit_the_output(engine) -> None:  # type: ignore[no-untyped-def]
    allowed = (260, 1234, 3000, 4000)
    out = run(engine(), request(12, allowed_token_ids=allowed))
    assert set(out.token_ids) <= set(allowed)


def test_the_repetition_stop_ends_a_loop(engine) -> None:  # type: ignore[no-untyped-def]
    stopping = StoppingParams(max_new_tokens=40, ignore_eos=True, repetition=RepetitionParams(2, 3))
    out = run(engine(), request(stopping=stopping, allowed_token_ids=(1234,)))
    assert out.final.finish_reason is FinishReason.REPETITION
    assert out.token_ids == [1234, 1234, 1234]


def test_phrase_bias_and_json_value_complete_plugins(engine) -> None:  # type: ignore[no-untyped-def]
    document = '{"a": 17, "b": [1, 2]}'
    out = run(engine(), request(
        40,
        logits_processors=(PluginCall("phrase_bias", {"phrases": [document], "bias": 100}, "logits_processors[0]"),),
        stopping_criteria=(PluginCall("json_value_complete", {"path": "$.a"}, "stopping_criteria[0]"),)))
    assert out.final.finish_reason is FinishReason.STOP_CRITERION, out.text
    assert out.text.lstrip().startswith('{"a": 17'), out.text
    assert '"b"' not in out.text
    assert "json_value_complete" in out.final.finish_detail
    assert {(p.name, p.kind) for p in out.final.plugins} == {("phrase_bias", "logits_processor"),
                                                           ("json_value_complete", "stopping_criterion")}


@pytest.mark.parametrize(("call", "field"), [
    (PluginCall("no_such_plugin", {}, "logits_processors[0]"), "logits_processors[0].name"),
    (PluginCall("phrase_bias", {"phrases": "x"}, "logits_processors[0]"), "logits_processors[0].params"),
    (PluginCall("phrase_bias", {"phrases": ["x"], "typo": 1}, "logits_processors[0]"), "logits_processors[0].params"),
])
def test_bad_plugin_calls_name_the_field(engine, call: PluginCall, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RequestValidationError) as caught:
        engine().prepare(request(logits_processors=(call,)))
    assert [v.field for v in caught.value.violations] == [field]


def test_a_failing_plugin_fails_its_request_only(engine) -> None:  # type: ignore[no-untyped-def]
    from proctor.decoding.plugins import PluginRegistry, PluginSpec

    def broken(view: object, logits: object) -> None:
        raise RuntimeError("boom")

    registry = PluginRegistry([PluginSpec("broken", "0.1", "logits_processor", lambda params, context: broken)])
    eng = engine(plugins=registry)
    failed = run(eng, request(8, logits_processors=(PluginCall("broken", {}, "logits_processors[0]"),)))
    assert failed.final.finish_reason is FinishReason.ERROR
    assert failed.final.error is not None and "broken" in failed.final.error and "boom" in failed.final.error
    assert eng.healthy
    after = run(eng, request(4))
    assert after.final.finish_reason is FinishReason.LENGTH and len(after.token_ids) == 4
