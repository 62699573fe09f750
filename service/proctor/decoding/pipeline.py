"""The decode pipeline: from the model's logits for a batch to one chosen token per row.

Processor order (the only place it is written down):

1. **masks** — tokens a row may not produce, combined into one boolean [B, V] tensor:
   end-of-sequence ids while ``min_new_tokens`` is not reached (later also the constraint mask
   and the forbidden-word mask);
2. **penalties** — repetition, presence, frequency, no-repeat-n-gram (``penalties.py``);
3. **temperature**, then **top-k → top-p → min-p** (``warpers.py``), sampling rows only;
4. **sample** — argmax for greedy rows, a draw from the row's own seeded generator otherwise.

Reported log-probabilities: ``raw_logprob`` is the chosen token's log-probability under the
model's own distribution (log-softmax of the unprocessed logits); ``final_logprob`` is under the
distribution actually used: after steps 1–3 for sampling rows, after steps 1–2 for greedy rows
(temperature and filters do not change an argmax). Alternatives come from the raw distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from proctor.decoding.penalties import PenaltyState
from proctor.decoding.sampler import sample_rows
from proctor.decoding.warpers import warp
from proctor.domain import SamplingParams


class DecodeRow(Protocol):
    """What the pipeline reads from one sequence's state (it never sees the batch's KV cache)."""

    @property
    def sampling(self) -> SamplingParams: ...
    @property
    def penalties(self) -> PenaltyState | None: ...
    @property
    def generator(self) -> torch.Generator | None: ...
    @property
    def top_logprobs(self) -> int: ...
    def banned_token_ids(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class RowDecision:
    token_id: int
    raw_logprob: float
    final_logprob: float
    alternatives: tuple[tuple[int, float], ...] = ()


def _apply_masks(logits: torch.Tensor, rows: list[DecodeRow]) -> bool:
    """Set banned tokens to -inf in place; return whether anything was masked."""
    banned = [row.banned_token_ids() for row in rows]
    if not any(banned):
        return False
    mask = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    for index, ids in enumerate(banned):
        if ids:
            mask[index, list(ids)] = True
    logits.masked_fill_(mask, float("-inf"))
    return True


def _per_row(rows: list[DecodeRow], attr: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([getattr(row.sampling, attr) for row in rows], device=device, dtype=dtype)


def run_pipeline(logits: torch.Tensor, rows: list[DecodeRow]) -> list[RowDecision]:
    """Process a [B, V] float32 logits tensor (consumed in place) and choose one token per row."""
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    processed = _apply_masks(logits, rows)
    for index, row in enumerate(rows):
        if row.penalties is not None:
            row.penalties.apply(logits[index])
            processed = True
    greedy = [row.sampling.greedy for row in rows]
    final = logits
    if not all(greedy):
        device = logits.device
        sampling_rows = [row for row, g in zip(rows, greedy, strict=True) if not g]
        index = torch.tensor([i for i, g in enumerate(greedy) if not g], device=device)
        warped = warp(
            logits.index_select(0, index),
            temperature=_per_row(sampling_rows, "temperature", device, logits.dtype),
            top_k=_per_row(sampling_rows, "top_k", device, torch.long),
            top_p=_per_row(sampling_rows, "top_p", device, logits.dtype),
            min_p=_per_row(sampling_rows, "min_p", device, logits.dtype),
        )
        final = logits.index_copy(0, index, warped)
        processed = True
    chosen = sample_rows(final, greedy, [row.generator for row in rows])
    final_logprobs = torch.log_softmax(final, dim=-1) if processed else raw_logprobs
    chosen_t = torch.tensor(chosen, device=logits.device).unsqueeze(-1)
    raw_chosen = raw_logprobs.gather(-1, chosen_t).squeeze(-1).tolist()
    final_chosen = final_logprobs.gather(-1, chosen_t).squeeze(-1).tolist()
    want = max(row.top_logprobs for row in rows)
    top_values, top_ids = (raw_logprobs.topk(want, dim=-1) if want else (None, None))
    decisions = []
    for index, row in enumerate(rows):
        alternatives: tuple[tuple[int, float], ...] = ()
        if row.top_logprobs and top_ids is not None and top_values is not None:
            ids = top_ids[index, : row.top_logprobs].tolist()
            values = top_values[index, : row.top_logprobs].tolist()
            alternatives = tuple(zip(ids, values, strict=True))
        decisions.append(RowDecision(chosen[index], raw_chosen[index], final_chosen[index], alternatives))
    return decisions
