"""Chunked prefill (engine/batch.py): a long prompt joins chunk by chunk while the running rows decode.

What must hold: the cache a chunked prefill leaves is the one a whole prefill leaves (so the output
is the same tokens), the running rows keep getting a token every step while it prefills, and a
long prompt cancelled mid-prefill frees everything.
"""

from __future__ import annotations

import time

import torch
from helpers.engine import Collector

from proctor.domain import GenerationRequest, SamplingParams, StoppingParams
from proctor.engine.llama_step import LlamaSlots

LONG = " ".join(f"item {i} of the list," for i in range(60))


def test_a_chunked_prefill_matches_a_whole_prefill(tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = tokenizer(LONG)["input_ids"]
    assert len(ids) > 300, len(ids)
    with torch.inference_mode():
        whole = LlamaSlots(tiny_model, 2, torch.device("cpu"))
        expected = whole.prefill(0, ids)
        after_whole = whole.decode([5])
        chunked = LlamaSlots(tiny_model, 2, torch.device("cpu"))
        staging = chunked.staging()
        for start in range(0, len(ids), 64):
            last = staging.prefill(0, ids[start:start + 64], start)
        chunked.adopt(staging, 0)
        after_chunked = chunked.decode([5])
    assert chunked.lengths[0] == len(ids) + 1 and staging.lengths[0] == 0
    assert torch.allclose(last, expected, atol=1e-4, rtol=1e-4)
    assert torch.allclose(after_chunked, after_whole, atol=1e-4, rtol=1e-4)
    assert int(last.argmax()) == int(expected.argmax())


def request(request_id: str, prompt: str, n: int) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, prompt=prompt, sampling=SamplingParams(),
                             stopping=StoppingParams(max_new_tokens=n, ignore_eos=True))


def test_running_rows_keep_decoding_while_a_long_prompt_prefills(make_engine, tokenizer) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(max_batch_size=4, prefill_chunk_tokens=32)
    running = Collector()
    engine.submit(engine.prepare(request("running", "Hi", 120)), running)
    assert running.first.wait(30)
    seen: list[int] = []
    long = Collector()

    def on_long(event):  # type: ignore[no-untyped-def]
        if not long.events:
            seen.append(len(running.token_ids))
        long(event)

    before = len(running.token_ids)
    engine.submit(engine.prepare(request("long", LONG, 4)), on_long)
    assert long.wait(60) and len(long.token_ids) == 4
    chunks = -(-len(tokenizer(LONG)["input_ids"]) // 32)
    # One chunk per step, and the running row decoded in each of those steps.
    assert seen[0] - before >= chunks - 2, (seen, before, chunks)
    assert running.wait(60) and len(running.token_ids) == 120


def test_a_long_prompt_alone_gives_the_tokens_of_an_unchunked_engine(make_engine) -> None:  # type: ignore[no-untyped-def]
    whole = make_engine(max_batch_size=2, prefill_chunk_tokens=0)
    chunked = make_engine(max_batch_size=2, prefill_chunk_tokens=48)
    outputs = []
    for engine in (whole, chunked):
        sink = Collector()
        engine.submit(engine.prepare(request("r", LONG, 12)), sink)
        assert sink.wait(60)
        outputs.append(sink.token_ids)
    assert outputs[0] == outputs[1]


def test_a_long_prompt_cancelled_mid_prefill_frees_its_place(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(max_batch_size=1, prefill_chunk_tokens=8)
    long = Collector()
    engine.submit(engine.prepare(request("long", LONG, 4)), long)
    deadline = time.monotonic() + 30
    while not engine._batch.staged and time.monotonic() < deadline:
        time.sleep(0.001)
    assert engine._batch.staged, "the long prompt never started its chunked prefill"
    engine.abort("long")
    assert long.wait(30)
    assert not long.token_ids
    after = Collector()
    engine.submit(engine.prepare(request("after", "Hi", 3)), after)
    assert after.wait(30) and len(after.token_ids) == 3
    assert engine.active_count() == 0
