"""Multi-token feeds of the slot forward (SlotForward.forward, executor/slot_forward.py) on the tiny model.

Jump-forward and speculation feed several tokens of one request in one forward and keep what the
verification accepts. That is exact only if every fed position's logits are the bits one decode step per
token gives, whatever the other slots feed beside it, and if a trimmed slot continues as if the rejected
positions had never been fed. Checked in every weight mode the tiny model runs.
"""

from __future__ import annotations

import pytest
import torch
from helpers.slots import feed_prompt, feed_prompts, feed_step

from proctor.executor import fused_decode
from proctor.executor.protocol import Feed
from proctor.executor.slot_forward import SlotForward
from proctor.executor.smoothing import calibration_ids
from proctor.executor.weights import fbgemm_available

PROMPT_LENGTHS = (3, 70, 130)  # a short row and rows past one and two 64-position blocks
FIRST_FEEDS = ([11, 12, 13, 14], [21], [31, 32])
SECOND_FEEDS = ([15, 16], [22, 23, 24, 25, 26], [33])
KEPT_AFTER_FIRST = (2, 1, 2)  # slot 0's last two positions rejected, as a failed draft would be


def modes() -> list[str]:
    found = ["dense", "fp16"]
    if fbgemm_available() and fused_decode.load_problem() is None:
        found += ["q8", "q4"]
    return found


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(10, 5000, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def stepwise(model, tokenizer, mode: str, prompt: list[int], tokens: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Each token of ``tokens`` fed alone, one decode step each, in a one-slot runner."""
    solo = SlotForward(model, 1, torch.device("cpu"), mode, calibration_ids(tokenizer))
    feed_prompt(solo, 0, prompt)
    return torch.cat([feed_step(solo, [token]) for token in tokens])


def extend(runner: SlotForward, feeds: tuple[list[int], ...] | list[list[int]]) -> torch.Tensor:
    """``feeds[i]`` to slot ``i`` in one forward, every fed position's logits."""
    return runner.forward([Feed(slot, list(feed), len(feed)) for slot, feed in enumerate(feeds)])


@pytest.mark.parametrize("mode", modes())
def test_every_extended_position_is_the_bits_of_a_decode_step(tiny_model, tokenizer, mode: str) -> None:  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        batch = SlotForward(tiny_model, len(PROMPT_LENGTHS), torch.device("cpu"), mode, calibration_ids(tokenizer))
        feed_prompts(batch, prompts())
        first = extend(batch, FIRST_FEEDS)
        assert first.shape[0] == sum(map(len, FIRST_FEEDS))
        assert batch.lengths[:3] == [n + len(f) for n, f in zip(PROMPT_LENGTHS, FIRST_FEEDS, strict=True)]
        for slot, kept in enumerate(KEPT_AFTER_FIRST):
            batch.trim(slot, PROMPT_LENGTHS[slot] + kept)
        second = extend(batch, SECOND_FEEDS)
        offsets = [0]
        for feed in FIRST_FEEDS:
            offsets.append(offsets[-1] + len(feed))
        offsets2 = [0]
        for feed in SECOND_FEEDS:
            offsets2.append(offsets2[-1] + len(feed))
        for slot, prompt in enumerate(prompts()):
            kept = KEPT_AFTER_FIRST[slot]
            fed = list(FIRST_FEEDS[slot][:kept]) + list(SECOND_FEEDS[slot])
            reference = stepwise(tiny_model, tokenizer, mode, prompt, fed)
            ours = torch.cat([first[offsets[slot]:offsets[slot] + kept], second[offsets2[slot]:offsets2[slot + 1]]])
            assert torch.equal(ours, reference), (
                f"{mode}: slot {slot} differs from one step per token (max gap {(ours - reference).abs().max():.3g})")


def test_trim_refuses_to_grow_a_slot(tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        runner = SlotForward(tiny_model, 1, torch.device("cpu"), "dense")
        feed_prompt(runner, 0, [1, 2, 3])
        with pytest.raises(ValueError, match="holds 3 tokens"):
            runner.trim(0, 4)
        runner.trim(0, 2)
    assert runner.lengths[0] == 2


@pytest.mark.parametrize("mode", modes())
def test_a_prompt_in_one_forward_is_the_bits_of_one_step_per_token(tiny_model, tokenizer, mode: str) -> None:  # type: ignore[no-untyped-def]
    """A prompt's rows attend in spans of consecutive rows over their keys widened once (layer_step.h): every
    position's logits are still the bits of feeding the prompt one token at a time (75 rows: spans of 32, 32, 11)."""
    prompt = prompts()[1][:5] + prompts()[2][:70]
    with torch.inference_mode():
        whole = SlotForward(tiny_model, 1, torch.device("cpu"), mode, calibration_ids(tokenizer))
        together = whole.forward([Feed(0, prompt, len(prompt))])
        one_by_one = stepwise(tiny_model, tokenizer, mode, prompt[:1], prompt[1:])
    assert torch.equal(together[1:], one_by_one), f"{mode}: max gap {(together[1:] - one_by_one).abs().max():.3g}"
