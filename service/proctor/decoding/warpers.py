"""Temperature, top-k, top-p, min-p and typical-p for a batch of rows with per-row settings."""

from __future__ import annotations

import math

import torch

from proctor.domain import SamplingParams

FLOORS = (1e-4, 1e-6, 0.0)  # probabilities above which a row's candidates are looked for, lower when the cut is below


def warp_values(params: SamplingParams) -> torch.Tensor | None:
    """A sampling view's settings as one float64 CPU tensor ``[temperature, top_k, top_p, min_p, typical_p]``, built
    once per request (engine/row_decoding.py) so a step stacks its sampling rows' and moves them to the device in one
    copy, instead of reading each setting of each row into a new tensor (TGI keeps its sampling tensors with the
    batch the same way). ``warp_settings`` takes the stacked rows apart; float64 holds every setting exactly (a top-k
    is far below 2**53). None for a greedy view: nothing is warped."""
    if params.greedy:
        return None
    return torch.tensor([params.temperature or 0.0, params.top_k, params.top_p, params.min_p, params.typical_p],
                        dtype=torch.float64)


def warp_settings(values: torch.Tensor, dtype: torch.dtype,
                  typical: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Stacked ``warp_values`` rows [S, 5] as ``warp``'s per-row tensors (temperature, top_k, top_p, min_p and, when
    ``typical`` (some row uses it), typical_p): the values a tensor built from each row's settings holds."""
    return (values[:, 0].to(dtype), values[:, 1].long(), values[:, 2].to(dtype), values[:, 3].to(dtype),
            values[:, 4].to(dtype) if typical else None)


def warp(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
         min_p: torch.Tensor, typical_p: torch.Tensor | None = None) -> torch.Tensor:
    """Return warped logits [B, V]. Per-row tensors are [B]; top_k 0 means off, typical_p 1 (or None
    for the whole batch, so the rows that do not use it cost nothing) means off.

    Order as in ``transformers``: temperature → top-k → top-p (on the renormalised top-k set)
    → min-p → typical-p. The most likely token always survives top-k/top-p/min-p;
    typical-p keeps at least the most *typical* token, as ``TypicalLogitsWarper`` does.
    """
    # Shift by the row maximum first: a tiny temperature then sends the others to -inf
    # instead of overflowing the maximum to +inf (softmax ignores the shift).
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature.unsqueeze(-1)
    if bool(((top_k > 0) | (top_p < 1.0) | (min_p > 0.0)).any()):
        logits = torch.stack([_filter_row(logits[row], int(top_k[row]), top_p[row], min_p[row])
                              for row in range(logits.shape[0])])
    if typical_p is not None and bool((typical_p < 1.0).any()):
        logits = typical(logits, typical_p)
    return logits


def _filter_row(row: torch.Tensor, top_k: int, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """One row's top-k, top-p and min-p. The tokens kept are a prefix of the row sorted by logit: found among
    its top-k set, or else among the tokens above a probability floor (an exact prefix of that order, lowered
    when the cut lies below it), instead of sorting the whole vocabulary (a sort of 152k logits took ~14 ms a
    row). Ties at the cut keep the lower token ids, so the kept set depends on the row alone."""
    vocab = row.shape[-1]
    if not (0 < top_k < vocab or bool(top_p < 1.0) or bool(min_p > 0.0)):  # this row asks for no filter
        return row
    if 0 < top_k < vocab:  # renormalised over the top-k set
        values = row.topk(top_k).values
        kept = _kept(values, values.logsumexp(dim=-1), top_p, min_p)
    else:
        normalizer = row.logsumexp(dim=-1)
        for floor in FLOORS:
            above = row[row >= normalizer + math.log(floor)] if floor > 0 else row
            if above.numel() == 0:  # no token that likely
                continue
            values = above.sort(descending=True).values
            kept = _kept(values, normalizer, top_p, min_p)
            if kept < values.numel() or above.numel() == vocab:
                break
    cut = values[kept - 1]
    keep = row > cut
    ties = kept - int(keep.sum())
    if ties > 0:
        keep[(row == cut).nonzero().flatten()[:ties]] = True
    return row.masked_fill(~keep, float("-inf"))


def _kept(values: torch.Tensor, normalizer: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> int:
    """How many of ``values`` (descending) top-p and min-p keep: the filters cut a suffix."""
    probs = (values - normalizer).exp()
    remove = (probs.cumsum(dim=-1) - probs) > top_p
    remove |= probs < min_p * probs[0]
    remove[0] = False
    return int(remove.int().argmax()) if bool(remove.any()) else values.numel()


def typical(logits: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Locally typical sampling (Meister et al. 2022), ``transformers.TypicalLogitsWarper`` step for step:
    sort tokens by how far their surprisal is from the entropy, keep them up to ``mass`` [B] of
    probability (ties with the last kept one included, the first always). Rows with mass >= 1 are untouched."""
    normalized = logits.log_softmax(dim=-1)
    entropy = -(normalized * normalized.exp()).nansum(dim=-1, keepdim=True)  # (-inf * 0 is nan: skipped)
    shifted = (-normalized - entropy).abs()
    sorted_scores, order = shifted.sort(dim=-1, descending=False)
    cumulative = logits.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
    last = (cumulative < mass.unsqueeze(-1)).sum(dim=-1).clamp_(max=logits.shape[-1] - 1)
    remove = sorted_scores > sorted_scores.gather(-1, last.unsqueeze(-1))
    remove[:, 0] = False
    remove &= (mass < 1.0).unsqueeze(-1)
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
