"""Prompts fed in pieces (engine/scheduler.py, engine/batch.py): within the step's token budget, beside the rows
that decode, in one forward.

What must hold: a prompt's logits and cache are the same bits whole or in any pieces (so the output is the
same tokens), the running rows keep getting a token every step while it is fed, and a long prompt cancelled
while being fed frees everything.
"""

from __future__ import annotations

import time

import torch
from helpers.engine import Collector

from proctor.domain import GenerationRequest, SamplingParams, StoppingParams
from proctor.engine.status import RequestStatus
from proctor.executor.protocol import Feed
from proctor.executor.slot_forward import SlotForward

LONG = " ".join(f"item {i} of the list," for i in range(60))


def test_a_prompt_in_pieces_is_the_bits_of_the_whole_prompt(tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = tokenizer(LONG)["input_ids"]
    assert len(ids) > 300, len(ids)
    with torch.inference_mode():
        whole = SlotForward(tiny_model, 2, torch.device("cpu"))
        expected = whole.forward([Feed(0, ids, 1)])
        after_whole = whole.forward([Feed(0, [5], 1)])
        pieces = SlotForward(tiny_model, 2, torch.device("cpu"))
        pieces.forward([Feed(1, [7, 8, 9], 0)])  # another row, fed beside the pieces
        for start, end in ((0, 17), (17, 200), (200, len(ids))):
            last = pieces.forward([Feed(0, ids[start:end], int(end == len(ids))), Feed(1, [start % 50 + 3], 1)])
        after_pieces = pieces.forward([Feed(0, [5], 1)])
    assert pieces.lengths[0] == len(ids) + 1
    assert torch.equal(last[:1], expected)
    assert torch.equal(after_pieces, after_whole)


def request(request_id: str, prompt: str, n: int) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, prompt=prompt, sampling=SamplingParams(),
                             stopping=StoppingParams(max_new_tokens=n, ignore_eos=True))


def test_running_rows_keep_decoding_while_a_long_prompt_is_fed(make_engine, tokenizer) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(max_batch_size=4, max_step_tokens=32)
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
    steps = -(-len(tokenizer(LONG)["input_ids"]) // 31)  # 31 prompt tokens a step beside the running row
    # The running row got a token in every step that fed a piece of the long prompt.
    assert seen[0] - before >= steps - 2, (seen, before, steps)
    assert running.wait(60) and len(running.token_ids) == 120


def test_a_long_prompt_gives_the_same_tokens_at_any_step_budget(make_engine) -> None:  # type: ignore[no-untyped-def]
    outputs = []
    for budget in (2048, 48, 9):
        engine = make_engine(max_batch_size=2, max_step_tokens=budget)
        sink = Collector()
        engine.submit(engine.prepare(request("r", LONG, 12)), sink)
        assert sink.wait(60)
        outputs.append(sink.token_ids)
    assert outputs[0] == outputs[1] == outputs[2]


def test_a_long_prompt_cancelled_while_fed_frees_its_place(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(max_batch_size=1, max_step_tokens=8)
    long = Collector()
    engine.submit(engine.prepare(request("long", LONG, 4)), long)
    deadline = time.monotonic() + 30
    state = engine.state_of("long")
    while state is not None and state.status is not RequestStatus.PREFILLING and time.monotonic() < deadline:
        time.sleep(0.001)
    assert state is not None and state.status is RequestStatus.PREFILLING, "the long prompt was never fed in pieces"
    engine.abort("long")
    assert long.wait(30)
    assert not long.token_ids
    after = Collector()
    engine.submit(engine.prepare(request("after", "Hi", 3)), after)
    assert after.wait(30) and len(after.token_ids) == 3
    assert engine.active_count() == 0
