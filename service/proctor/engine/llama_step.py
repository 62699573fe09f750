"""A batched forward pass for Llama-family models over a slot KV cache (continuous batching).

Why our own forward instead of the model's: transformers' caches share one write position across
the batch, so rows of different lengths need left padding that grows and has to be re-aligned each
time a request joins. Here every running request owns a *slot* (row ``i`` of a preallocated cache
per layer) with its own length: a decode step writes each row's new key/value at that row's own
position and attends over its own prefix (a per-row mask), so requests join after a batch-1
prefill into a free slot and leave by moving the last slot into the hole. No padding, no re-alignment.

The arithmetic is the model's own: its weights (q/k/v and gate/up fused into one matrix product each),
its rotary embedding module, RMSNorm as transformers computes it, and ``scaled_dot_product_attention``.
A test checks logits against the model's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

KV_GROWTH_TOKENS = 256  # the cache's length grows in steps of this many tokens
# Decode attention runs over the longest row's length rounded up to this many positions. Rows see
# only their own prefix (the rest is masked), but the vectorised sums inside the matrix products and
# the softmax group elements by position; with the span a multiple of this block, padding only adds
# exact zeros to the same groups, so a row's result is bit-identical alone or next to a longer row
# (measured: lengths 3..700 all identical at 64, none at 1; tests/integration/test_batching_real.py).
ATTENTION_SPAN_BLOCK = 64
PACK_ROWS_HINT = 16  # oneDNN picks its blocked weight layout for about this many rows


def unsupported_reason(model: Any) -> str | None:
    """Why this model cannot use the slot forward (None when it can)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", "") != "llama":
        return f"architecture {getattr(cfg, 'model_type', '?')!r} is not Llama"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}"
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "biased projections"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    return None


@dataclass(frozen=True)
class _Layer:
    in_norm: torch.Tensor
    qkv: torch.Tensor  # [(H + 2·KVH)·D, hidden]
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2·I, hidden]
    down: torch.Tensor


class LlamaSlots:
    """The model's weights plus a KV cache of ``max_slots`` rows, each with its own length."""

    def __init__(self, model: Any, max_slots: int, device: torch.device) -> None:
        cfg = model.config
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the slot forward does not support this model: {reason}")
        inner = model.model
        self.device = device
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = float(cfg.rms_norm_eps)
        self.max_slots = max_slots
        self._scale = self.head_dim ** -0.5
        self._packed = device.type == "cpu" and _can_pack(model.lm_head.weight.dtype)
        store = self._pack
        # The model's own linear weights stay referenced by the model; the packed copies double the
        # weight memory on CPU (about 0.5 GB for the default model in fp32).
        self._embed = inner.embed_tokens.weight
        self._final_norm = inner.norm.weight
        self._lm_head = store(model.lm_head.weight)
        self._rotary = inner.rotary_emb
        self.dtype = self._embed.dtype
        self._layers = [
            _Layer(
                in_norm=layer.input_layernorm.weight,
                qkv=store(torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                                     layer.self_attn.v_proj.weight])),
                o=store(layer.self_attn.o_proj.weight),
                post_norm=layer.post_attention_layernorm.weight,
                gate_up=store(torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight])),
                down=store(layer.mlp.down_proj.weight),
            )
            for layer in inner.layers
        ]
        self.bytes_per_token = len(self._layers) * 2 * self.kv_heads * self.head_dim * self._embed.element_size()
        self._capacity = 0  # tokens per slot
        self._rows = 0  # slots allocated (grows in powers of two up to max_slots)
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self.lengths = [0] * max_slots  # tokens held per slot

    @property
    def thread_invariant(self) -> bool:
        """A row's logits are the same bits at any intra-op thread count with oneDNN-packed weights
        (tests/integration/test_threads_real.py), so the engine may tune the count under load."""
        return self._packed

    # --- cache management ---------------------------------------------------------------------
    def bytes_for(self, rows: int, length: int) -> int:
        """Cache size once ``rows`` slots can each hold ``length`` tokens."""
        return self._round_rows(max(rows, self._rows)) * _round_up(max(length, self._capacity)) * self.bytes_per_token

    def reserve(self, rows: int, length: int) -> None:
        """Grow the cache to at least ``rows`` slots of ``length`` tokens (copying what is there)."""
        if rows <= self._rows and length <= self._capacity:
            return
        new_rows, capacity = self._round_rows(max(rows, self._rows)), _round_up(max(length, self._capacity))
        shape = (new_rows, self.kv_heads, capacity, self.head_dim)
        # Zeros, not empty: masked positions are multiplied by 0 in attention, and 0 * NaN is NaN.
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self._layers]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self._layers]
        if self._rows:
            for old, new in zip(self._keys + self._values, keys + values, strict=True):
                new[:self._rows, :, :self._capacity].copy_(old)
        self._keys, self._values, self._rows, self._capacity = keys, values, new_rows, capacity

    def _round_rows(self, rows: int) -> int:
        return min(self.max_slots, 1 << max(0, rows - 1).bit_length())

    def move(self, source: int, target: int) -> None:
        """Move slot ``source`` into slot ``target`` (a finished request's slot is reused)."""
        n = self.lengths[source]
        for cache in self._keys + self._values:
            cache[target, :, :n].copy_(cache[source, :, :n])
        self.lengths[target] = n
        self.lengths[source] = 0

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0

    # --- forward passes -------------------------------------------------------------------------
    def prefill(self, slot: int, token_ids: list[int]) -> torch.Tensor:
        """Run a whole prompt into ``slot`` (which must be empty); return its last logits [1, V]."""
        n = len(token_ids)
        self.reserve(slot + 1, n + 1)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        positions = torch.arange(n, device=self.device)
        h = F.embedding(ids, self._embed)  # [T, hidden]
        cos, sin = self._rope(h, positions)
        for index, layer in enumerate(self._layers):
            x = self._norm(h, layer.in_norm)
            q, k, v = self._project_qkv(x, layer, cos, sin)  # [T, H|KVH, D]
            self._keys[index][slot, :, :n].copy_(k.transpose(0, 1))
            self._values[index][slot, :, :n].copy_(v.transpose(0, 1))
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                 v.transpose(0, 1)[None], is_causal=True, enable_gqa=True)
            h = h + self._linear(out[0].transpose(0, 1).reshape(n, -1), layer.o)
            h = h + self._mlp(self._norm(h, layer.post_norm), layer)
        self.lengths[slot] = n
        return self._logits(h[-1:])

    def decode(self, token_ids: list[int]) -> torch.Tensor:
        """Feed one token to each of slots ``0..B-1`` (B = len(token_ids)); return logits [B, V]."""
        rows = len(token_ids)
        lengths = self.lengths[:rows]
        span = -(-(max(lengths) + 1) // ATTENTION_SPAN_BLOCK) * ATTENTION_SPAN_BLOCK
        self.reserve(rows, span)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        positions = torch.tensor(lengths, dtype=torch.long, device=self.device)
        row_index = torch.arange(rows, device=self.device)
        # Additive mask: 0 where a row may look, -inf past its own length (x + 0 == x exactly).
        hidden = torch.arange(span, device=self.device)[None, :] > positions[:, None]
        bias = torch.zeros((rows, span), dtype=torch.float32, device=self.device).masked_fill_(hidden, float("-inf"))
        bias = bias.to(self.dtype)[:, None, None, :]
        h = F.embedding(ids, self._embed)  # [B, hidden]
        cos, sin = self._rope(h, positions)
        for index, layer in enumerate(self._layers):
            x = self._norm(h, layer.in_norm)
            q, k, v = self._project_qkv(x, layer, cos, sin)  # [B, H|KVH, D]
            keys, values = self._keys[index], self._values[index]
            keys[row_index, :, positions] = k
            values[row_index, :, positions] = v
            out = self._attend(q, keys[:rows, :, :span], values[:rows, :, :span], bias)
            h = h + self._linear(out, layer.o)
            h = h + self._mlp(self._norm(h, layer.post_norm), layer)
        for slot in range(rows):
            self.lengths[slot] += 1
        return self._logits(h)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Decode attention as plain matrix products over a block-rounded span: unlike the fused CPU
        kernel (whose split of the work depends on the batch), a row's result then depends only on its
        own prefix (see ATTENTION_SPAN_BLOCK)."""
        rows, group = q.shape[0], self.heads // self.kv_heads
        q = q.view(rows, self.kv_heads, group, self.head_dim)
        scores = torch.matmul(q, keys.transpose(-1, -2)) * self._scale + bias  # [B, KVH, G, L]
        out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(values.dtype), values)  # [B, KVH, G, D]
        return out.reshape(rows, self.heads * self.head_dim)

    # --- pieces -----------------------------------------------------------------------------------
    def _rope(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._rotary(h, positions[None])
        return cos[0][:, None, :], sin[0][:, None, :]  # [N, 1, D], broadcast over heads

    def _norm(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x = h.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x.to(h.dtype)

    def _project_qkv(self, x: torch.Tensor, layer: _Layer, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, d = x.shape[0], self.head_dim
        q, k, v = self._linear(x, layer.qkv).view(n, -1, d).split([self.heads, self.kv_heads, self.kv_heads], dim=1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def _mlp(self, x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        gate, up = self._linear(x, layer.gate_up).chunk(2, dim=-1)
        return self._linear(F.silu(gate) * up, layer.down)

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        """On CPU, reorder a weight once into oneDNN's blocked layout (see ``_linear``)."""
        weight = weight.contiguous()
        return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS_HINT) if self._packed else weight

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T``. On CPU through oneDNN with prepacked weights: measured on the 2-core AVX2
        machine (bench/README.md) 1.6x faster than ``F.linear`` at one row and 1.4x at 16 — MKL
        repacks every weight on every call once there is more than one row — and, unlike MKL, a
        row's result does not depend on how many rows share the product, which is what makes a
        request's output the same alone or in a batch."""
        if self._packed:
            return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
        return F.linear(x, weight)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self._linear(self._norm(h, self._final_norm), self._lm_head).float()


def _can_pack(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights of this type here (bf16 needs AVX-512 or AVX-NE-CONVERT)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros((8, 8), dtype=dtype), PACK_ROWS_HINT)
    except RuntimeError:
        return False
    return True


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _round_up(length: int) -> int:
    return -(-length // KV_GROWTH_TOKENS) * KV_GROWTH_TOKENS
