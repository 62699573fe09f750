"""Quality of a weight mode against the dense reference: greedy agreement and perplexity (test and bench).

Shared by tests/integration/test_weight_modes_real.py and bench/weights.py so the figures in
bench/README.md and the thresholds the tests hold are computed the same way: on the slot forward as the server
runs it (every position a row of the step, ``SlotForward.forward``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from helpers.slots import feed_prompt, feed_step
from proctor.executor.slot_forward import SlotForward
from proctor.executor.smoothing import calibration_ids

# Fixed chat prompts (the user turn; the chat template is applied) and a fixed text for perplexity.
AGREEMENT_PROMPTS = [
    "Write a short confidentiality clause for a contract between two companies.",
    "What is the capital of France? Answer in one sentence.",
    "List three colours of the rainbow.",
    "Explain what a hash chain is in two sentences.",
    "Translate 'good morning' into French and German.",
    "Give a JSON object with a name and an age.",
    "Summarise the plot of Romeo and Juliet in one sentence.",
    "Write a haiku about the sea.",
]
PERPLEXITY_TEXT = (
    "The parties agree that any information disclosed by one party to the other in connection with this "
    "agreement shall be treated as confidential. The receiving party shall not disclose such information to "
    "any third party without the prior written consent of the disclosing party, and shall use it solely for "
    "the purpose of evaluating a potential business relationship. These obligations shall survive the "
    "termination of this agreement for a period of three years. Nothing in this agreement grants either party "
    "any licence to the other party's intellectual property. This agreement is governed by the laws of England "
    "and Wales, and the courts of London shall have exclusive jurisdiction over any dispute arising from it."
)


@dataclass(frozen=True)
class Agreement:
    identical_share: float  # prompts whose whole greedy output equals dense's
    mean_tokens_until_divergence: float
    min_tokens_until_divergence: int
    tokens: int  # greedy tokens generated per prompt


def chat_ids(tokenizer: Any, user: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


def slots_for(model: Any, tokenizer: Any, mode: str, rows: int = 1) -> SlotForward:
    return SlotForward(model, rows, torch.device("cpu"), mode, calibration_ids(tokenizer))


def greedy(slots: SlotForward, prompt_ids: list[int], tokens: int) -> list[int]:
    slots.free(0)
    with torch.inference_mode():
        logits = feed_prompt(slots, 0, prompt_ids)
        out = [int(logits.argmax())]
        for _ in range(tokens - 1):
            out.append(int(feed_step(slots, [out[-1]]).argmax()))
    return out


def agreement(model: Any, tokenizer: Any, mode: str, tokens: int = 48) -> Agreement:
    prompts = [chat_ids(tokenizer, p) for p in AGREEMENT_PROMPTS]
    runs = []
    for ids in prompts:
        reference = greedy(slots_for(model, tokenizer, "dense"), ids, tokens)
        candidate = greedy(slots_for(model, tokenizer, mode), ids, tokens)
        runs.append(next((i for i, (a, b) in enumerate(zip(reference, candidate, strict=True)) if a != b), tokens))
    return Agreement(identical_share=sum(r == tokens for r in runs) / len(runs),
                     mean_tokens_until_divergence=sum(runs) / len(runs), min_tokens_until_divergence=min(runs),
                     tokens=tokens)


def perplexity(model: Any, tokenizer: Any, mode: str) -> float:
    ids = tokenizer(PERPLEXITY_TEXT)["input_ids"]
    slots = slots_for(model, tokenizer, mode)
    with torch.inference_mode():
        logits = feed_prompt(slots, 0, ids, every_position=True)
    logprobs = torch.log_softmax(logits[:-1].float(), dim=-1)
    nll = -logprobs.gather(-1, torch.tensor(ids[1:])[:, None]).mean()
    return math.exp(float(nll))
