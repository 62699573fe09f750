"""The engine end to end on a tiny random-weight model with the real tokenizer.

Greedy output must equal ``transformers``' own ``generate()`` token for token; batching (rows of
different lengths, rows leaving at different steps) must not change any request's output.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import pytest
import torch
from helpers.engine import Collector

from proctor.domain import (
    FinishReason,
    GenerationRequest,
    Overloaded,
    RequestValidationError,
    SamplingParams,
    StoppingParams,
)
from proctor.engine.engine import Engine

PROMPTS = {
    "english": "The capital of France is",
    "chinese": "你好，世界。今天天气很好，我们去公园散步吧。",
    "short": "Hi",
    "long": "Once upon a time, in a small village by the sea, there lived an old fisherman who told stories",
}
LONG = 400  # tokens: long enough that a request is still running while the test acts on it
_ids = itertools.count()


def _fresh_id(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


def greedy(prompt: str, n: int, request_id: str | None = None, **stopping: object) -> GenerationRequest:
    stopping.setdefault("ignore_eos", True)
    return GenerationRequest(request_id=request_id or _fresh_id("g"), prompt=prompt,
                             stopping=StoppingParams(max_new_tokens=n, **stopping))  # type: ignore[arg-type]


def sampled(prompt: str, n: int, seed: int | None) -> GenerationRequest:
    return GenerationRequest(request_id=_fresh_id("s"), prompt=prompt,
                             sampling=SamplingParams(temperature=1.0, top_p=0.95, seed=seed),
                             stopping=StoppingParams(max_new_tokens=n, ignore_eos=True))


def hf_greedy(model, tokenizer, prompt: str, n: int, **kwargs: object) -> list[int]:  # type: ignore[no-untyped-def]
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    kwargs.setdefault("eos_token_id", None)  # ignore_eos: EOS may be produced and decoding goes on
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             pad_token_id=tokenizer.pad_token_id, **kwargs)
    return out[0, ids.shape[1]:].tolist()


def run(engine: Engine, request: GenerationRequest, timeout_s: float = 60) -> Collector:
    sink = Collector()
    engine.submit(engine.prepare(request), sink)
    sink.wait(timeout_s)
    return sink


@pytest.mark.parametrize("name", ["english", "chinese"])
def test_greedy_equals_transformers_generate(tiny_engine, tiny_model, tokenizer, name: str) -> None:  # type: ignore[no-untyped-def]
    n = 24
    expected = hf_greedy(tiny_model, tokenizer, PROMPTS[name], n)
    sink = run(tiny_engine, greedy(PROMPTS[name], n))
    assert sink.token_ids == expected
    final = sink.final
    assert final.finish_reason is FinishReason.LENGTH
    assert final.usage is not None
    assert final.usage.completion_tokens == n
    assert final.usage.prompt_tokens == len(tokenizer(PROMPTS[name])["input_ids"])
    assert sink.text == tokenizer.decode(expected, skip_special_tokens=True)


def test_length_finish_with_one_token_per_event(tiny_engine) -> None:  # type: ignore[no-untyped-def]
    sink = run(tiny_engine, greedy(PROMPTS["short"], 5))
    assert [len(e.token_ids) for e in sink.events] == [1] * 5
    assert [e.finished for e in sink.events] == [False] * 4 + [True]
    assert sink.final.finish_reason is FinishReason.LENGTH
    assert sink.final.timings is not None and sink.final.timings.total_ms > 0


def test_min_new_tokens_suppresses_eos(make_engine, tiny_loaded, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = PROMPTS["english"]
    first = hf_greedy(tiny_model, tokenizer, prompt, 1)[0]
    # Make the model's favourite first token the end-of-sequence token.
    engine = make_engine(loaded=dataclasses.replace(tiny_loaded, eos_token_ids=(first,)))

    plain = run(engine, greedy(prompt, 8, ignore_eos=False))
    assert plain.token_ids == [first]
    assert plain.final.finish_reason is FinishReason.EOS

    held = run(engine, greedy(prompt, 8, ignore_eos=False, min_new_tokens=3))
    assert held.final.error is None, held.final.error
    expected = hf_greedy(tiny_model, tokenizer, prompt, 8, eos_token_id=first, min_new_tokens=3)
    assert held.token_ids == expected
    assert len(held.token_ids) >= 3
    assert first not in held.token_ids[:3]
    if first in held.token_ids:
        assert held.final.finish_reason is FinishReason.EOS and held.token_ids[-1] == first


def test_penalties_match_transformers_generate(tiny_engine, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt, n = PROMPTS["long"], 16
    plain = hf_greedy(tiny_model, tokenizer, prompt, n)
    # A penalty below 1 rewards repeating the prompt, which changes this model's output for sure.
    for penalty, ngram in ((0.3, 0), (0.3, 2), (1.5, 1)):
        expected = hf_greedy(tiny_model, tokenizer, prompt, n, repetition_penalty=penalty, no_repeat_ngram_size=ngram)
        request = dataclasses.replace(greedy(prompt, n), sampling=SamplingParams(repetition_penalty=penalty,
                                                                                 no_repeat_ngram_size=ngram))
        sink = run(tiny_engine, request)
        assert sink.final.error is None, sink.final.error
        assert sink.token_ids == expected, (penalty, ngram)
    assert hf_greedy(tiny_model, tokenizer, prompt, n, repetition_penalty=0.3) != plain


def test_stop_token_id_ends_with_the_token_included(tiny_engine, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = PROMPTS["english"]
    reference = hf_greedy(tiny_model, tokenizer, prompt, 12)
    stop_at = next(i for i in range(3, 12) if reference[i] not in reference[:i])
    sink = run(tiny_engine, greedy(prompt, 12, stop_token_ids=(reference[stop_at], 49_151)))
    assert sink.token_ids == reference[: stop_at + 1]
    assert sink.final.finish_reason is FinishReason.STOP_TOKEN


def test_stop_string_ends_before_the_match(tiny_engine, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = PROMPTS["english"]
    full = run(tiny_engine, greedy(prompt, 16, request_id="full"))
    text = full.text
    assert len(text) > 12
    stop = text[6:10]
    start = text.find(stop)
    sink = run(tiny_engine, greedy(prompt, 16, request_id="stopped", stop=(stop,)))
    assert sink.final.finish_reason is FinishReason.STOP_STRING
    assert sink.text == text[:start]
    assert stop in sink.final.finish_detail
    assert sink.token_ids == full.token_ids[: len(sink.token_ids)]


def test_top_logprobs_details(tiny_engine) -> None:  # type: ignore[no-untyped-def]
    request = dataclasses.replace(greedy(PROMPTS["english"], 4), top_logprobs=3)
    sink = run(tiny_engine, request)
    details = [d for e in sink.events for d in e.details]
    assert [d.token_id for d in details] == sink.token_ids
    for detail in details:
        assert len(detail.top_logprobs) == 3
        assert detail.top_logprobs[0].token_id == detail.token_id  # greedy picks the raw argmax
        assert detail.logprob == pytest.approx(detail.top_logprobs[0].logprob, abs=1e-5)
        assert detail.final_logprob == pytest.approx(detail.logprob, abs=1e-5)


def test_seeded_sampling_is_reproducible(tiny_engine) -> None:  # type: ignore[no-untyped-def]
    prompt = PROMPTS["english"]
    first = run(tiny_engine, sampled(prompt, 16, seed=1234))
    again = run(tiny_engine, sampled(prompt, 16, seed=1234))
    other = run(tiny_engine, sampled(prompt, 16, seed=4321))
    assert first.final.seed == again.final.seed == 1234
    assert first.token_ids == again.token_ids
    assert first.text == again.text
    assert other.token_ids != first.token_ids
    greedy_ids = run(tiny_engine, greedy(prompt, 16)).token_ids
    assert first.token_ids != greedy_ids, "temperature 1 on this model must not collapse to greedy"


def test_unset_seed_is_reported_and_replays(tiny_engine) -> None:  # type: ignore[no-untyped-def]
    prompt = PROMPTS["chinese"]
    picked = run(tiny_engine, sampled(prompt, 12, seed=None))
    seed = picked.final.seed
    assert seed != 0
    replay = run(tiny_engine, sampled(prompt, 12, seed=seed))
    assert replay.token_ids == picked.token_ids
    another = run(tiny_engine, sampled(prompt, 12, seed=None))
    assert another.final.seed != seed


def test_the_largest_uint64_seed_works(tiny_engine) -> None:  # type: ignore[no-untyped-def]
    sink = run(tiny_engine, sampled(PROMPTS["short"], 3, seed=2**64 - 1))
    assert sink.final.seed == 2**64 - 1
    assert sink.final.finish_reason is FinishReason.LENGTH


def test_abort_cancels_and_the_engine_serves_the_next_request(tiny_engine, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    long_sink = Collector()
    tiny_engine.submit(tiny_engine.prepare(greedy(PROMPTS["long"], LONG, request_id="long")), long_sink)
    assert long_sink.first.wait(30)
    tiny_engine.abort("long")
    long_sink.wait(30)
    assert long_sink.final.finish_reason is FinishReason.CANCELLED
    assert 0 < len(long_sink.token_ids) < LONG

    sink = run(tiny_engine, greedy(PROMPTS["english"], 6, request_id="next"))
    assert sink.token_ids == hf_greedy(tiny_model, tokenizer, PROMPTS["english"], 6)
    tiny_engine.abort("no-such-request")  # aborting an unknown id is harmless


def test_deadline_in_the_past(tiny_engine) -> None:  # type: ignore[no-untyped-def]
    request = dataclasses.replace(greedy(PROMPTS["english"], 8), deadline=time.monotonic() - 1)
    sink = run(tiny_engine, request)
    assert sink.final.finish_reason is FinishReason.DEADLINE
    assert sink.token_ids == []
    assert tiny_engine.active_count() == 0


def test_deadline_during_generation(tiny_engine) -> None:  # type: ignore[no-untyped-def]
    request = dataclasses.replace(greedy(PROMPTS["long"], LONG), deadline=time.monotonic() + 0.1)
    sink = run(tiny_engine, request)
    assert sink.final.finish_reason is FinishReason.DEADLINE
    assert len(sink.token_ids) < LONG


def test_batched_requests_match_their_solo_runs(make_engine, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    names = ["short", "english", "chinese", "long"]
    lengths = [len(tokenizer(PROMPTS[n])["input_ids"]) for n in names]
    assert len(set(lengths)) == len(names), "the rows must have different lengths"
    budgets = [6, 10, 14, 18]  # rows leave the batch at different steps
    expected = [hf_greedy(tiny_model, tokenizer, PROMPTS[n], b) for n, b in zip(names, budgets, strict=True)]

    engine = make_engine(start=False, max_batch_size=4)
    sinks = []
    for i, (name, budget) in enumerate(zip(names, budgets, strict=True)):
        sink = Collector()
        engine.submit(engine.prepare(greedy(PROMPTS[name], budget, request_id=f"b{i}")), sink)
        sinks.append(sink)
    engine.start()  # all four are waiting, so they join the same first step
    for sink in sinks:
        sink.wait(60)
    got = [sink.token_ids for sink in sinks]
    if got != expected:
        pytest.fail(f"batched output differs from solo output: {_first_divergence(got, expected)}")
    assert [s.final.finish_reason for s in sinks] == [FinishReason.LENGTH] * 4


def _first_divergence(got: list[list[int]], expected: list[list[int]]) -> str:
    for row, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g != e:
            step = next((i for i, (a, b) in enumerate(zip(g, e, strict=False)) if a != b), min(len(g), len(e)))
            return f"row {row} diverges at step {step}: {g} vs {e}"
    return "no divergence"


def test_overloaded_when_the_waiting_queue_is_full(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(max_waiting=1, max_batch_size=1)
    running = Collector()
    engine.submit(engine.prepare(greedy(PROMPTS["long"], LONG, request_id="running")), running)
    assert running.first.wait(30)
    waiting = Collector()
    engine.submit(engine.prepare(greedy(PROMPTS["short"], 2, request_id="waiting")), waiting)
    with pytest.raises(Overloaded):
        engine.submit(engine.prepare(greedy(PROMPTS["short"], 2, request_id="refused")), Collector())
    assert engine.active_count() == 2  # the refused request left nothing behind
    engine.abort("running")
    running.wait(30)
    waiting.wait(30)
    assert running.final.finish_reason is FinishReason.CANCELLED
    assert waiting.final.finish_reason is FinishReason.LENGTH
    # The queue has room again.
    assert run(engine, greedy(PROMPTS["short"], 2, request_id="refused")).final.finish_reason is FinishReason.LENGTH


def test_duplicate_running_request_id_is_rejected(tiny_engine) -> None:  # type: ignore[no-untyped-def]
    first = Collector()
    tiny_engine.submit(tiny_engine.prepare(greedy(PROMPTS["long"], LONG, request_id="dup")), first)
    assert first.first.wait(30)
    with pytest.raises(RequestValidationError) as info:
        tiny_engine.submit(tiny_engine.prepare(greedy(PROMPTS["short"], 2, request_id="dup")), Collector())
    assert [v.field for v in info.value.violations] == ["request_id"]
    tiny_engine.abort("dup")
    first.wait(30)
    assert first.final.finish_reason is FinishReason.CANCELLED


def test_a_request_is_forgotten_before_its_final_event_is_delivered(tiny_engine) -> None:  # type: ignore[no-untyped-def]
    """A caller that saw the final event may reuse the request id at once (idempotent retries).

    The final event is the caller's only signal that the request ended, so by the time it is
    delivered the engine must no longer count the request as running.
    """
    seen_active: list[int] = []

    def sink(event) -> None:  # type: ignore[no-untyped-def]
        collector(event)
        if event.finished:
            seen_active.append(tiny_engine.active_count())

    collector = Collector()
    tiny_engine.submit(tiny_engine.prepare(greedy(PROMPTS["short"], 2, request_id="again")), sink)
    collector.wait(30)
    assert seen_active == [0], "the request still counted as running when its final event was delivered"
    again = run(tiny_engine, greedy(PROMPTS["short"], 2, request_id="again"))
    assert again.final.finish_reason is FinishReason.LENGTH


def test_chat_request_runs_through_the_template(tiny_engine, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    from proctor.domain import ChatMessage

    request = GenerationRequest(request_id="chat", messages=(ChatMessage("user", "Bonjour"),),
                                stopping=StoppingParams(max_new_tokens=5, ignore_eos=True))
    prepared = tiny_engine.prepare(request)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Bonjour"}], tokenize=False,
                                         add_generation_prompt=True)
    assert list(prepared.prompt_ids) == tokenizer(text, add_special_tokens=False)["input_ids"]
    sink = Collector()
    tiny_engine.submit(prepared, sink)
    sink.wait(30)
    ids = torch.tensor([list(prepared.prompt_ids)])
    with torch.inference_mode():
        expected = tiny_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=5,
                                       eos_token_id=None, pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:]
    assert sink.token_ids == expected.tolist()


def test_shutdown_refuses_new_work(make_engine) -> None:  # type: ignore[no-untyped-def]
    from proctor.domain import ShuttingDown

    engine = make_engine()
    engine.shutdown(grace_s=0.5)
    with pytest.raises(ShuttingDown):
        engine.submit(engine.prepare(greedy(PROMPTS["short"], 2)), Collector())
