"""The slot forward's elementwise pieces, each as the family's transformers module computes it
(executor/families.py): RMSNorm in Llama's and Gemma's arithmetic, the rotation (full or partial),
soft-capping, the MLP's gate, and the additive masks of decode attention (whole prefix or a window)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from proctor.executor.families import Family


def rms_norm(h: torch.Tensor, weight: torch.Tensor, family: Family) -> torch.Tensor:
    """Llama: ``w · x̂`` with x̂ cast back first; Gemma: ``(1 + w) · x̂`` in float32, then cast."""
    x = h.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + family.eps)
    if family.norm_offset:
        return (x * (1.0 + weight.float())).to(h.dtype)
    return weight * x.to(h.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the first ``cos.shape[-1]`` dims of each head (all of them but for Phi-3's
    partial rotary factor), the rest passed through."""
    dims = cos.shape[-1]
    if dims != x.shape[-1]:
        return torch.cat((rotate(x[..., :dims], cos, sin), x[..., dims:]), dim=-1)
    half = dims // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap · tanh(x / cap)`` (Gemma 2's attention and final logits); unchanged without a cap."""
    if cap is None:
        return x
    return torch.tanh(x / cap) * cap


def gate(x: torch.Tensor, family: Family) -> torch.Tensor:
    return F.gelu(x, approximate="tanh") if family.activation == "gelu_tanh" else F.silu(x)


def decode_biases(positions: torch.Tensor, span: int, windows: set[int | None], dtype: torch.dtype
                  ) -> dict[int | None, torch.Tensor]:
    """Per window (None: the whole prefix), the additive mask [B, 1, 1, span] of a decode step: 0 where row
    ``b``'s query at ``positions[b]`` may look, -inf elsewhere (x + 0 == x exactly, so a row's sums do not
    depend on the other rows). A window ``w`` hides keys at distance ``w`` or more, as transformers does."""
    keys = torch.arange(span, device=positions.device)[None, :]
    biases = {}
    for window in windows:
        hidden = keys > positions[:, None]
        if window is not None:
            hidden = hidden | (keys <= positions[:, None] - window)
        bias = torch.zeros((len(positions), span), dtype=torch.float32, device=positions.device)
        biases[window] = bias.masked_fill_(hidden, float("-inf")).to(dtype)[:, None, None, :]
    return biases


def prefill_visible(start: int, total: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """Which keys each prompt query sees ([T, total] booleans), or None for plain causal attention over a
    first chunk without a window (then ``is_causal`` does it)."""
    if start == 0 and window is None:
        return None
    queries = torch.arange(start, total, device=device)[:, None]
    keys = torch.arange(total, device=device)[None, :]
    visible = keys <= queries
    if window is not None:
        visible = visible & (keys > queries - window)
    return visible
