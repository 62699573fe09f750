"""The default model's own GGUF served from its blocks (``--model FILE.gguf``, ``--weights gguf``).

Everything comes from the file: the config, the tokenizer (equal to the Hugging Face tokenizer the
setup converted, on text, special tokens and the chat template) and the weights, which are the same
Q4_1/Q8_0 blocks the q4 mode rebuilds from the converted model, so greedy tokens must agree with q4's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.slots import feed_prompt, feed_step

from proctor.config import Settings
from proctor.executor.slot_forward import SlotForward
from proctor.models.loader import load_model

TEXTS = ["Hello world", "  leading spaces and ünïcödé, 数字 123", "<|im_start|>user\nHi<|im_end|>\n", "a\n\n\tb"]
STEPS = 24


@pytest.fixture(scope="module")
def from_gguf(default_gguf: Path):  # type: ignore[no-untyped-def]
    return load_model(Settings(model=str(default_gguf), weights="auto"))


def test_a_gguf_file_defaults_to_its_own_blocks(from_gguf) -> None:  # type: ignore[no-untyped-def]
    assert from_gguf.weights == "gguf"
    assert from_gguf.vocab_size == 49152 and from_gguf.eos_token_ids == (2,)


def test_the_tokenizer_and_chat_template_come_from_the_file(from_gguf, tokenizer) -> None:  # type: ignore[no-untyped-def]
    for text in TEXTS:
        assert from_gguf.tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"], text
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    assert (from_gguf.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def test_its_logits_follow_the_q4_mode_on_the_same_blocks(from_gguf, tokenizer, default_model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """The same weights; only the activations' rounding differs (llama.cpp's float16 block scales here,
    float32 in q4), so along one teacher-forced sequence the logits stay close and the argmax agrees."""
    q4 = load_model(Settings(model=str(default_model_dir), weights="q4"))
    ids = tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                                  tokenize=False, add_generation_prompt=True))["input_ids"]
    forced = tokenizer(" Red, green and blue are three colours of the rainbow.")["input_ids"][:STEPS]
    runs = []
    with torch.inference_mode():
        for loaded in (from_gguf, q4):
            slots = SlotForward(loaded.model, 1, torch.device("cpu"), loaded.weights)
            steps = [feed_prompt(slots, 0, ids)[0]] + [feed_step(slots, [token])[0] for token in forced]
            runs.append(torch.stack(steps))
    gap = (runs[0] - runs[1]).abs().amax(dim=-1)
    agree = (runs[0].argmax(-1) == runs[1].argmax(-1)).float().mean()
    assert float(gap.max()) < 0.1 * float(runs[1].abs().max()) and float(agree) >= 0.9
