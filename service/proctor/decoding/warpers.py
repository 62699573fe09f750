"""Temperature, top-k, top-p and min-p for a batch of rows with per-row settings, in one sort."""

from __future__ import annotations

import torch


def warp(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
         min_p: torch.Tensor) -> torch.Tensor:
    """Return warped logits [B, V]. Per-row tensors are [B]; top_k 0 means off.

    Order as in ``transformers``: temperature → top-k → top-p (on the renormalised top-k set)
    → min-p. The most likely token always survives.
    """
    # Shift by the row maximum first: a tiny temperature then sends the others to -inf
    # instead of overflowing the maximum to +inf (softmax ignores the shift).
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature.unsqueeze(-1)
    needs_filter = bool(((top_k > 0) | (top_p < 1.0) | (min_p > 0.0)).any())
    if not needs_filter:
        return logits
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(-1)
    remove = ranks >= k
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    remove |= (probs.cumsum(dim=-1) - probs) > top_p.unsqueeze(-1)
    remove |= probs < (min_p.unsqueeze(-1) * probs[:, :1])
    remove[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
