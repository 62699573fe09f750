"""The engine may change its intra-op thread count under load (engine/thread_tuner.py) only because the
slot forward gives a row the same bits at any thread count: checked here on the real model.

transformers' own forward does not (its logits at 1 and 2 threads differ in the last bits), which is why
the tuner stays off for models that fall back to it.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.real_model

PROMPTS = ["Write a haiku about the sea.", "Summarise: the Receiving Party shall keep it secret. " * 6, "Hi"]


def test_slot_forward_logits_are_bit_identical_at_one_two_and_three_threads(server: Any) -> None:
    import torch
    from helpers.slots import feed_prompts, feed_step

    from proctor.executor.slot_forward import SlotForward

    loaded = server.running.engine.loaded
    rows = [loaded.tokenizer(p)["input_ids"] for p in PROMPTS]
    before = torch.get_num_threads()
    results = {}
    try:
        with torch.inference_mode():
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                slots = SlotForward(loaded.model, 4, loaded.device, loaded.weights)  # the weights the server built
                assert slots.capabilities.thread_invariant
                firsts = feed_prompts(slots, rows)
                seconds = feed_step(slots, [int(t) for t in firsts.argmax(-1)])
                thirds = feed_step(slots, [7] * len(rows))
                results[threads] = (firsts, seconds, thirds)
    finally:
        torch.set_num_threads(before)
    for threads in (2, 3):
        for name, one, other in zip(("prefill", "decode 1", "decode 2"), results[1], results[threads], strict=True):
            assert torch.equal(one, other), f"{name} logits differ between 1 and {threads} threads"
