"""Choosing the next token per row: argmax for greedy rows, a seeded draw for the others."""

from __future__ import annotations

import torch

from proctor.decoding import logits_ops


def draw(final_logits: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a row's distribution (config.SAMPLER_REVISION 2): the inverse of its cumulative
    distribution over the tokens left (logits above -inf, in token order, summed in float64) at one uniform
    from the request's generator. One draw a step whatever the vocabulary (torch.multinomial, revision 1,
    drew an exponential per token: ~3 ms a row at 152k). The generator is the request's CPU one on every
    device (engine/sequence.py), so a seed draws the same uniforms on CPU and CUDA."""
    left = (final_logits > float("-inf")).nonzero().flatten()
    values = final_logits[left]
    cumulative = (values - values.max()).double().exp().cumsum(dim=0)
    uniform = torch.rand((), generator=generator, dtype=torch.float64).to(cumulative.device)  # a CPU generator
    index = int(torch.searchsorted(cumulative, uniform * cumulative[-1], right=True))
    return int(left[min(index, left.numel() - 1)])


def sample_rows(final_logits: torch.Tensor, greedy: list[bool], generators: list[torch.Generator | None],
                argmax: list[int] | None = None) -> list[int]:
    """One token id per row. Each sampling row draws from its own request's generator, so a
    request's draws do not depend on which other requests share the batch. ``argmax``: the rows'
    argmax when the caller already has it (logits left unprocessed), saving a pass over [B, V]."""
    chosen = list(argmax) if argmax is not None else logits_ops.row_argmax(final_logits)
    for row, is_greedy in enumerate(greedy):
        if not is_greedy:
            chosen[row] = draw(final_logits[row], generators[row])
    return chosen


def sample_one(final_logits: torch.Tensor, greedy: bool, generator: torch.Generator | None) -> int:
    """Choose again for one row (after a token was removed from it)."""
    if greedy:
        return int(final_logits.argmax())
    return draw(final_logits, generator)
