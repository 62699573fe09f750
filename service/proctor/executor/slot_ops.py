"""The slot forward's elementwise pieces, each as the family's transformers module computes it
(executor/families.py): RMSNorm in Llama's and Gemma's arithmetic, the rotary tables and the rotation (full or
partial), soft-capping, the MLP's gate, and the additive masks of decode attention (whole prefix or a window)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from proctor.executor.families import LENGTH_DEPENDENT_ROPE, Family
from proctor.executor.slot_cache import round_up


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


class RotaryTables:
    """The cos/sin tables [L, 1, D] of each rotary table the layers use (per layer type where the family has
    several), filled by the model's rotary module once per growth: it is elementwise in the position, so a table row
    is the same bits as computing that position alone. A rope whose frequencies depend on the sequence's length
    (dynamic, longrope) is computed per regime: positions below ``rope_original_length`` from a table no longer than
    that, the rest from the long one, so a row never depends on how long another row is."""

    def __init__(self, rotary: Any, family: Family, device: torch.device) -> None:
        self._rotary = rotary
        self._family = family
        self._device = device
        self.by_key: dict[str | None, tuple[torch.Tensor, torch.Tensor]] = {}

    def at(self, h: torch.Tensor, positions: torch.Tensor,
           needed: int) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
        """cos/sin for ``positions`` ([N, 1, D]) from each table the layers use (gathered once a step, not once a
        layer); ``needed``: the highest position + 1."""
        rope = {}
        for key in set(self._family.rope_keys):
            cos, sin = self.table(h, needed, key)
            rope[key] = (cos[positions], sin[positions])
        return rope

    def table(self, h: torch.Tensor, needed: int, key: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Table ``key`` grown to at least ``needed`` positions (``h``: activations of the model's dtype)."""
        tables = self.by_key.get(key)
        if tables is None or needed > tables[0].shape[0]:
            length = round_up(needed)
            cos, sin = self._call(h, length, key)
            short = self._family.rope_original_length
            if self._family.rope_type in LENGTH_DEPENDENT_ROPE and length > short:
                short_cos, short_sin = self._call(h, short, key)
                cos, sin = torch.cat((short_cos, cos[short:])), torch.cat((short_sin, sin[short:]))
            tables = self.by_key[key] = (cos[:, None, :], sin[:, None, :])
        return tables

    def _call(self, h: torch.Tensor, length: int, key: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(length, device=self._device)[None]
        cos, sin = self._rotary(h, positions) if key is None else self._rotary(h, positions, key)
        return cos[0], sin[0]
