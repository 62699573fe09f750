"""The decode pipeline: from the model's logits for a batch to one chosen token per row.

Processor order (the only place it is written down):

1. **masks** — tokens a row may not produce, combined into one boolean [B, V] tensor: the
   constraint mask (from each row's matcher, advanced by the engine after sampling) and
   end-of-sequence ids while ``min_new_tokens`` is not reached (later also the forbidden-word
   mask). A row left with no token is a dead end (``RowDecision.dead_end``);
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

from proctor.constraints.backend import Matcher, allocate_bitmask, bitmask_to_bool
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
    @property
    def matcher(self) -> Matcher | None: ...
    def banned_token_ids(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class RowDecision:
    token_id: int
    raw_logprob: float
    final_logprob: float
    alternatives: tuple[tuple[int, float], ...] = ()
    dead_end: str = ""  # set (with token_id -1) when the masks left no token


def _apply_masks(logits: torch.Tensor, rows: list[DecodeRow]) -> bool:
    """Set every token a row may not produce to -inf, in place; return whether anything was masked.

    The constraint masks of all rows are filled into one [B, W] bitmask and applied together
    with the banned ids as one boolean [B, V] tensor.
    """
    banned = [row.banned_token_ids() for row in rows]
    constrained = [index for index, row in enumerate(rows) if row.matcher is not None]
    if not any(banned) and not constrained:
        return False
    vocab = logits.shape[-1]
    if constrained:
        bitmask = allocate_bitmask(len(rows), vocab)
        for index in constrained:
            matcher = rows[index].matcher
            assert matcher is not None
            matcher.fill_bitmask(bitmask, index)
        forbidden = ~bitmask_to_bool(bitmask.to(logits.device), vocab)
    else:
        forbidden = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    for index, ids in enumerate(banned):
        if ids:
            forbidden[index, list(ids)] = True
    logits.masked_fill_(forbidden, float("-inf"))
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
    dead = _dead_rows(logits) if processed else []
    greedy = [row.sampling.greedy or index in dead for index, row in enumerate(rows)]
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
        if index in dead:
            decisions.append(RowDecision(-1, 0.0, 0.0, (), dead_end="the constraint and masks left no token to choose"))
            continue
        decisions.append(RowDecision(chosen[index], raw_chosen[index], final_chosen[index], alternatives))
    return decisions


def _dead_rows(logits: torch.Tensor) -> list[int]:
    """Rows with no finite logit left; they are given dummy logits so the batch can still sample."""
    dead = torch.isinf(logits).all(dim=-1).nonzero().flatten().tolist()
    for index in dead:
        logits[index] = 0.0
    return dead
