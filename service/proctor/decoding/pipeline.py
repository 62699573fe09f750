"""The decode pipeline: from the model's logits for a batch to one chosen token per row.

Processor order (the only place it is written down):

1. **masks** — tokens a row may not produce, one boolean [B, V] tensor (``masks.py``): the
   constraint, forbidden phrases, ``allowed_token_ids``, end-of-sequence before
   ``min_new_tokens``. A row left with no token is a dead end (``RowDecision.dead_end``);
2. **processors** — ``logit_bias``, then the request's logits-processor plugins in request
   order, then the request's generation controls at this step (``controls.py``): the
   ``must_include`` end ban (end-of-sequence and stop tokens, unless nothing else is left) and a
   forced token (``forced_tokens``: every other token removed); the masks are applied again
   afterwards, so no processor can revive a masked token (a forced token a mask removed leaves
   the row with nothing: a dead end);
3. **penalties** — repetition, presence, frequency, no-repeat-n-gram (``penalties.py``);
4. **temperature**, then **top-k → top-p → min-p → typical-p** (``warpers.py``), sampling rows only.
   This is the order of ``transformers``' ``GenerationMixin._get_logits_processor`` (5.x: temperature,
   top-k, top-p, min-p, typical-p; its top-h, epsilon and eta warpers are not offered here);
5. **sample** — argmax for greedy rows, a draw from the row's own seeded generator otherwise.
   A row is greedy for a greedy request, and for any request on a forced step or within its
   ``greedy_first_tokens``: the sequence state presents such a step's sampling as greedy, so the
   generator draws nothing on it.

Reported log-probabilities: ``raw_logprob`` is the chosen token's log-probability under the
model's own distribution (log-softmax of the unprocessed logits); ``final_logprob`` is under the
distribution actually used: after steps 1–4 for sampling rows, after steps 1–3 for greedy rows
(temperature and filters do not change an argmax). Alternatives come from the raw distribution.
``removed_by`` names the mask layer or processor that removed the model's own top choice.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from proctor.decoding import logits_ops
from proctor.decoding.lookahead import DeadEndSearch
from proctor.decoding.masks import (
    ConstraintAhead,
    MaskedRow,
    Masks,
    apply_banned,
    build_masks,
    constraint_bitmask,
    only_constraints,
)
from proctor.decoding.penalties import PenaltyState
from proctor.decoding.sampler import sample_one, sample_rows
from proctor.decoding.warpers import warp, warp_settings
from proctor.domain import FinishReason, SamplingParams

RowProcessor = tuple[str, Callable[[torch.Tensor], None]]
MAX_RECHOICES = 32  # tokens a row may reject as dead ends in one step before it takes the masked choice


class DecodeRow(MaskedRow, Protocol):
    """What the pipeline reads from one sequence's state (it never sees the batch's KV cache)."""

    @property
    def step_sampling(self) -> SamplingParams: ...
    @property
    def sampling_values(self) -> torch.Tensor | None: ...  # ``warpers.warp_values`` of ``step_sampling``, made once
    @property
    def penalties(self) -> PenaltyState | None: ...
    @property
    def generator(self) -> torch.Generator | None: ...
    @property
    def top_logprobs(self) -> int: ...
    @property
    def processors(self) -> tuple[RowProcessor, ...]: ...


@dataclass(frozen=True, slots=True)
class RowDecision:
    token_id: int
    raw_logprob: float
    final_logprob: float
    alternatives: tuple[tuple[int, float], ...] = ()
    dead_end: str = ""  # set (with token_id -1) when the masks left no token
    dead_end_reason: FinishReason = FinishReason.DEAD_END
    removed_by: str = ""
    allowed_count: int = -1


def _run_processors(logits: torch.Tensor, rows: Sequence[DecodeRow], masks: Masks, top: list[int]) -> bool:
    """Step 2: logit bias and plugins per row, then the masks once more. Returns whether any ran."""
    ran = False
    for index, row in enumerate(rows):
        for name, process in row.processors:
            process(logits[index])
            ran = True
            if not masks.removed_by[index] and bool(torch.isneginf(logits[index, top[index]])):
                masks.removed_by[index] = name
    if ran and masks.banned is not None:
        apply_banned(logits, masks.banned)
    return ran


def run_pipeline(logits: torch.Tensor, rows: Sequence[DecodeRow],
                 on_masks: Callable[[float, list[str]], None] | None = None,
                 ahead: ConstraintAhead | None = None) -> list[RowDecision]:
    """Process a [B, V] float32 logits tensor (consumed in place) and choose one token per row.

    ``on_masks`` (metrics) is told how long building a step's masks took (the part filled ``ahead``, while the
    forward ran, included), and which layer removed each row's top choice, on the steps that have any mask.
    ``ahead``: the rows' constraint bitmasks, filled before the logits were read (masks.constraints_ahead)."""
    raw_lse = logits_ops.row_logsumexp(logits)  # log-probabilities are logits - lse, computed where needed
    top = logits_ops.row_argmax(logits)
    picked = _greedy_under_constraints(logits, rows, top, raw_lse, on_masks, ahead)
    if picked is not None:
        return picked
    start = time.perf_counter()
    masks = build_masks(logits, rows, top, ahead)
    if on_masks is not None and masks.banned is not None:
        on_masks(time.perf_counter() - start + (ahead.seconds if ahead is not None else 0.0), masks.removed_by)
    processed = masks.banned is not None
    # The steps below edit logits in place; the raw ones are kept only when some step will.
    will_edit = processed or any(row.processors or row.penalties is not None for row in rows)
    raw = logits.clone() if will_edit else logits
    if masks.banned is not None:
        apply_banned(logits, masks.banned)
    edited = _run_processors(logits, rows, masks, top)
    for index, row in enumerate(rows):
        if row.penalties is not None:
            row.penalties.apply(logits[index])
            edited = True
    if edited or (processed and not masks.constraint_only):
        dead = _dead_rows(logits)
    else:  # masked by constraints alone (or not at all): the counts say which rows have nothing left
        dead = _dead_rows(logits, [i for i, count in enumerate(masks.allowed_count) if count == 0])
    processed = processed or edited
    greedy = [row.step_sampling.greedy or index in dead for index, row in enumerate(rows)]
    final = logits
    if not all(greedy):
        sampling_rows = [row for row, g in zip(rows, greedy, strict=True) if not g]
        sampled = torch.tensor([i for i, g in enumerate(greedy) if not g], device=logits.device)
        values = torch.stack([_values(row) for row in sampling_rows]).to(logits.device)
        typical = any(row.step_sampling.typical_p < 1.0 for row in sampling_rows)
        temperature, top_k, top_p, min_p, typical_p = warp_settings(values, logits.dtype, typical)
        warped = warp(logits.index_select(0, sampled), temperature=temperature, top_k=top_k, top_p=top_p,
                      min_p=min_p, typical_p=typical_p)
        final = logits.index_copy(0, sampled, warped)
        processed = True
    chosen = sample_rows(final, greedy, [row.generator for row in rows], argmax=None if processed else top)
    if any(row.matcher is not None and row.forbidden is not None for row in rows):
        processed = _avoid_dead_ends(final, rows, chosen, greedy, dead, masks) or processed
    final_lse = logits_ops.row_logsumexp(final) if processed else raw_lse
    return _decisions(raw, final, rows, chosen, raw_lse, final_lse, dead, masks)


def _values(row: DecodeRow) -> torch.Tensor:
    """A sampling row's settings tensor (a row is sampled only when its step's view is not greedy)."""
    values = row.sampling_values
    if values is None:
        raise ValueError("a sampled row has no sampling values (its step's view is greedy)")
    return values


def _greedy_under_constraints(logits: torch.Tensor, rows: Sequence[DecodeRow], top: list[int], raw_lse: torch.Tensor,
                              on_masks: Callable[[float, list[str]], None] | None,
                              ahead: ConstraintAhead | None = None) -> list[RowDecision] | None:
    """The common constrained step — every row greedy, no processor or penalty, and the constraint the only
    mask — chosen from the raw logits and the constraint's bitmasks in one kernel pass, with no [B, V] mask,
    copy or fill (the same tokens and bits as the general path; ~0.2 ms less a step at one row). None when
    the step does not qualify or the kernel library is not loaded."""
    if not all(row.step_sampling.greedy and not row.processors and row.penalties is None for row in rows):
        return None
    constrained = only_constraints(rows)
    if not constrained or not logits_ops.suits(logits):  # (checked first: the fallback fills the masks itself)
        return None
    start = time.perf_counter()
    bitmask = ahead.bitmask if ahead is not None else constraint_bitmask(rows, constrained, logits.shape[-1])
    picked = logits_ops.masked_pick(logits, bitmask)
    if picked is None:
        return None
    chosen, final_lse, allowed = picked
    counts = [allowed[index] if row.matcher is not None else -1 for index, row in enumerate(rows)]
    # The top choice was masked iff the masked argmax differs from it (it is the first index of the maximum).
    removed = ["constraint" if row.matcher is not None and chosen[index] != top[index] else ""
               for index, row in enumerate(rows)]
    if on_masks is not None:
        on_masks(time.perf_counter() - start + (ahead.seconds if ahead is not None else 0.0), removed)
    dead = [index for index in constrained if counts[index] == 0]
    masks = Masks(None, removed, [""] * len(rows), counts, constraint_only=True)
    return _decisions(logits, logits, rows, chosen, raw_lse, final_lse, dead, masks)


def _decisions(raw: torch.Tensor, final: torch.Tensor, rows: Sequence[DecodeRow], chosen: list[int],
               raw_lse: torch.Tensor, final_lse: torch.Tensor, dead: list[int], masks: Masks) -> list[RowDecision]:
    """Each row's decision: the chosen token's raw and final log-probabilities, its alternatives (raw)."""
    chosen_t = torch.tensor(chosen, device=raw.device).unsqueeze(-1)
    raw_chosen = (raw.gather(-1, chosen_t).squeeze(-1) - raw_lse).tolist()
    final_chosen = (final.gather(-1, chosen_t).squeeze(-1) - final_lse).tolist()
    want = max(row.top_logprobs for row in rows)
    top_values, top_ids = None, None
    if want:
        top_values, top_ids = logits_ops.row_topk(raw, want)
        top_values = top_values - raw_lse[:, None]
    decisions = []
    for index, row in enumerate(rows):
        alternatives: tuple[tuple[int, float], ...] = ()
        if row.top_logprobs and top_ids is not None and top_values is not None:
            ids = top_ids[index, : row.top_logprobs].tolist()
            values = top_values[index, : row.top_logprobs].tolist()
            alternatives = tuple(zip(ids, values, strict=True))
        if index in dead or not math.isfinite(final_chosen[index]):  # (the second: nothing finite was left)
            decisions.append(_dead_end(masks.forbidden_dead_end[index]))
            continue
        decisions.append(RowDecision(chosen[index], raw_chosen[index], final_chosen[index], alternatives,
                                     removed_by=masks.removed_by[index], allowed_count=masks.allowed_count[index]))
    return decisions


def _avoid_dead_ends(final: torch.Tensor, rows: Sequence[DecodeRow], chosen: list[int], greedy: list[bool],
                     dead: list[int], masks: Masks) -> bool:
    """Rows with a constraint and forbidden phrases: re-choose while the chosen token leads only to dead ends.

    A removed token is set to -inf in ``final`` (so the reported final logprobs account for it).
    Returns whether any token was removed.
    """
    search = DeadEndSearch(final.shape[-1])
    removed = False
    for index, row in enumerate(rows):
        if row.matcher is None or row.forbidden is None or index in dead:
            continue
        for _ in range(MAX_RECHOICES):
            if search.viable(row.matcher, row.forbidden, chosen[index]):
                break
            final[index, chosen[index]] = float("-inf")
            removed = True
            if bool(torch.isneginf(final[index]).all()):
                dead.append(index)
                masks.forbidden_dead_end[index] = search.phrase or row.forbidden.index.phrases[0]
                final[index] = 0.0
                break
            chosen[index] = sample_one(final[index], greedy[index], row.generator)
    return removed


def _dead_end(phrase: str) -> RowDecision:
    if phrase:
        return RowDecision(-1, 0.0, 0.0, (), dead_end=f"every way forward the constraint allows would complete the "
                                                      f"forbidden phrase {phrase!r}",
                           dead_end_reason=FinishReason.FORBIDDEN_PHRASE)
    return RowDecision(-1, 0.0, 0.0, (), dead_end="the constraint and masks left no token to choose")


def _dead_rows(logits: torch.Tensor, known: list[int] | None = None) -> list[int]:
    """Rows with no finite logit left (``known``: already counted); they are given dummy logits so the
    batch can still sample."""
    dead = known if known is not None else [
        index for index, peak in enumerate(logits.amax(dim=-1).tolist()) if peak == float("-inf")]
    for index in dead:
        logits[index] = 0.0
    return dead
