"""Temperature, top-k, top-p, min-p and typical-p for a batch of rows with per-row settings."""

from __future__ import annotations

import torch


def warp(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
         min_p: torch.Tensor, typical_p: torch.Tensor | None = None) -> torch.Tensor:
    """Return warped logits [B, V]. Per-row tensors are [B]; top_k 0 means off, typical_p 1 (or None
    for the whole batch, so the rows that do not use it cost nothing) means off.

    Order as in ``transformers``: temperature → top-k → top-p (on the renormalised top-k set)
    → min-p → typical-p. The most likely token always survives top-k/top-p/min-p (one sort);
    typical-p keeps at least the most *typical* token, as ``TypicalLogitsWarper`` does.
    """
    # Shift by the row maximum first: a tiny temperature then sends the others to -inf
    # instead of overflowing the maximum to +inf (softmax ignores the shift).
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature.unsqueeze(-1)
    needs_filter = bool(((top_k > 0) | (top_p < 1.0) | (min_p > 0.0)).any())
    if needs_filter:
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
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    if typical_p is not None and bool((typical_p < 1.0).any()):
        logits = typical(logits, typical_p)
    return logits


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
