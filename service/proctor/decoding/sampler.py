"""Choosing the next token per row: argmax for greedy rows, a seeded draw for the others."""

from __future__ import annotations

import torch

from proctor.engine import fused_decode


def sample_rows(final_logits: torch.Tensor, greedy: list[bool], generators: list[torch.Generator | None],
                argmax: list[int] | None = None) -> list[int]:
    """One token id per row. Each sampling row draws from its own request's generator, so a
    request's draws do not depend on which other requests share the batch. ``argmax``: the rows'
    argmax when the caller already has it (logits left unprocessed), saving a pass over [B, V]."""
    chosen = list(argmax) if argmax is not None else fused_decode.row_argmax(final_logits)
    for row, is_greedy in enumerate(greedy):
        if not is_greedy:
            probs = final_logits[row].softmax(dim=-1)
            chosen[row] = int(torch.multinomial(probs, 1, generator=generators[row]).item())
    return chosen


def sample_one(final_logits: torch.Tensor, greedy: bool, generator: torch.Generator | None) -> int:
    """Choose again for one row (after a token was removed from it)."""
    if greedy:
        return int(final_logits.argmax())
    return int(torch.multinomial(final_logits.softmax(dim=-1), 1, generator=generator).item())
