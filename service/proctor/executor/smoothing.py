"""Per-channel smoothing for int8 activations (SmoothQuant, Xiao et al. 2022), folded into the weights.

Why: ``q8`` quantizes each row of activations with one scale, and a few input channels of an LLM's
linear layers carry values far larger than the rest, so most channels keep only a handful of int8
levels (measured on the default model: perplexity +1.9 % and greedy output diverging after ~8
tokens). Dividing channel ``c`` of the input by ``s_c`` and multiplying column ``c`` of the weight by
``s_c`` leaves the product unchanged and moves the outliers into the weights, which are quantized
per output channel and take it well. ``s_c = max|x_c|^α / max|W_c|^(1-α)``, α = 0.5, from one dense
forward over a fixed calibration text (so the scales, and the outputs, are the same on every start).

The division costs nothing at run time: it is folded into whatever produces the input — the RMSNorm
weight before ``qkv``, ``gate_up`` and the LM head, the ``up`` rows before ``down`` (``silu(g) · u`` is
linear in ``u``), and the ``v`` rows before ``o`` (attention is linear in ``v``; query heads that share
a key/value head share its scales).
"""

from __future__ import annotations

from typing import Any

import torch

ALPHA = 0.5
CALIBRATION_TEXT = (
    "Contract for services. The supplier shall deliver the goods described in Schedule 1 by 31 March 2027. "
    "Payment of EUR 12,500.00 is due within 30 days of the invoice. {\"party\": \"Acme Corp\", \"role\": "
    "\"disclosing\", \"clauses\": [{\"id\": \"4.2\", \"title\": \"Confidentiality\"}]} Either party may "
    "terminate this agreement with 60 days' written notice. 本协议受中华人民共和国法律管辖。 Questions? "
    "Write to legal@example.com. 1, 2, 3, 4, 5, 6, 7, 8, 9, 10. The quick brown fox jumps over the lazy dog."
)


def input_peaks(model: Any, tokenizer_ids: list[int]) -> dict[str, torch.Tensor]:
    """Largest |input| per channel of every linear layer over one dense forward of ``tokenizer_ids``."""
    peaks: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            def record(_module: Any, args: tuple[torch.Tensor, ...], name: str = name) -> None:
                peak = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(dim=0).float()
                peaks[name] = torch.maximum(peaks[name], peak) if name in peaks else peak
            handles.append(module.register_forward_pre_hook(record))
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([tokenizer_ids]), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return peaks


def smoothing_scales(activation_peak: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
    """``s_c`` for one input shared by ``weights`` (each [out, in])."""
    weight_peak = torch.stack([w.detach().abs().amax(dim=0).float() for w in weights]).amax(dim=0)
    tiny = torch.finfo(torch.float32).tiny
    scales = activation_peak.clamp(min=1e-5).pow(ALPHA) / weight_peak.clamp(min=1e-5).pow(1 - ALPHA)
    return scales.clamp(min=tiny)


def shared_by_kv_head(scales: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """Scales over ``o``'s input [H·D] made equal across the query heads that share a key/value head
    (the largest of the group), as one scale per (kv head, dim) [KVH·D] — what the ``v`` rows take."""
    return scales.view(kv_heads, heads // kv_heads, head_dim).amax(dim=1).reshape(-1)


def expand_to_heads(shared: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """The per-(kv head, dim) scales back over ``o``'s input channels [H·D]."""
    per_kv = shared.view(kv_heads, 1, head_dim).expand(kv_heads, heads // kv_heads, head_dim)
    return per_kv.reshape(-1)


def calibration_ids(tokenizer: Any) -> list[int]:
    """The calibration text in the model's own tokens."""
    return list(tokenizer(CALIBRATION_TEXT)["input_ids"])
