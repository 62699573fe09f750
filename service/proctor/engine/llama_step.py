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

from typing import Any

import torch
import torch.nn.functional as F

from proctor.engine import fused_decode
from proctor.engine.slot_weights import LayerWeights, slot_weights

KV_GROWTH_TOKENS = 256  # the cache's length grows in steps of this many tokens
# Decode attention runs over the longest row's length rounded up to this many positions. Rows see
# only their own prefix (the rest is masked), but the vectorised sums inside the matrix products and
# the softmax group elements by position; with the span a multiple of this block, padding only adds
# exact zeros to the same groups, so a row's result is bit-identical alone or next to a longer row
# (measured: lengths 3..700 all identical at 64, none at 1; tests/integration/test_batching_real.py).
ATTENTION_SPAN_BLOCK = 64


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


class LlamaSlots:
    """The model's weights plus a KV cache of ``max_slots`` rows, each with its own length."""

    def __init__(self, model: Any, max_slots: int, device: torch.device, weights: str = "dense",
                 calibration_ids: list[int] | None = None) -> None:
        cfg = model.config
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the slot forward does not support this model: {reason}")
        self.device = device
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = float(cfg.rms_norm_eps)
        self.max_slots = max_slots
        self._scale = self.head_dim ** -0.5
        self._model = model
        self.weights = slot_weights(model, weights, calibration_ids)
        self._final_norm = self.weights.final_norm
        self._lm_head = self.weights.lm_head
        self._rotary = model.model.rotary_emb
        self._rope_cos = self._rope_sin = torch.empty(0)
        self.dtype = self._final_norm.dtype  # the activations' dtype (q8 keeps its embedding table in fp16)
        self._layers = self.weights.layers
        # q8 and q4 decode through the C++ kernels (fused_decode.py), which take head sizes in multiples of
        # 8 and keep keys and values in float16: half the memory, and half the bytes a step reads over a
        # long prefix (both are approximate anyway; the other modes keep the model's dtype).
        self._fused = weights in ("q8", "q4") and self.head_dim % 8 == 0 and self.heads // self.kv_heads <= 8
        self._decode_layer = fused_decode.decode_layer(weights) if self._fused else None  # raises if it cannot load
        self._fused_arguments = [_fused_arguments(layer, weights) for layer in self._layers] if self._fused else []
        self.cache_dtype = torch.float16 if self._fused else self.dtype
        self.bytes_per_token = (len(self._layers) * 2 * self.kv_heads * self.head_dim
                                * torch.empty(0, dtype=self.cache_dtype).element_size())
        self._capacity = 0  # tokens per slot
        self._rows = 0  # slots allocated (grows in powers of two up to max_slots)
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self.lengths = [0] * max_slots  # tokens held per slot

    @property
    def thread_invariant(self) -> bool:
        """A row's logits are the same bits at any intra-op thread count with oneDNN-packed or fbgemm
        weights (tests/integration/test_threads_real.py), so the engine may tune the count under load."""
        return self.weights.thread_invariant

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
        for caches in (self._keys, self._values):
            if not caches:
                caches.extend(None for _ in self._layers)  # type: ignore[misc]
            for index, old in enumerate(caches):  # one layer at a time: the old and new caches never coexist whole
                # Zeros, not empty: masked positions are multiplied by 0 in attention, and 0 * NaN is NaN.
                new = torch.zeros(shape, dtype=self.cache_dtype, device=self.device)
                if old is not None:
                    new[:self._rows, :, :self._capacity].copy_(old)
                caches[index] = new
        self._rows, self._capacity = new_rows, capacity

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

    def copy(self, source: int, target: int) -> None:
        """Copy slot ``source`` into slot ``target`` (beam search: every beam starts from the prompt)."""
        n = self.lengths[source]
        self.reserve(target + 1, n + 1)
        for cache in self._keys + self._values:
            cache[target, :, :n].copy_(cache[source, :, :n])
        self.lengths[target] = n

    def reorder(self, parents: list[int]) -> None:
        """Slot ``i`` takes the cache of slot ``parents[i]`` (beam search; every slot holds the same length)."""
        if parents == list(range(len(parents))):
            return
        n = self.lengths[0]
        index = torch.tensor(parents, dtype=torch.long, device=self.device)
        for cache in self._keys + self._values:
            cache[:len(parents), :, :n] = cache.index_select(0, index)[:, :, :n]

    # --- forward passes -------------------------------------------------------------------------
    def prefill(self, slot: int, token_ids: list[int], start: int = 0, every_position: bool = False) -> torch.Tensor:
        """Run prompt tokens into ``slot`` after the ``start`` it already holds (0: an empty slot; more:
        the next chunk of a chunked prefill); return the last position's logits [1, V] (or every
        position's, [T, V]: perplexity measurements)."""
        n = len(token_ids)
        if self.lengths[slot] != start:
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} tokens, not {start}")
        total = start + n
        self.reserve(slot + 1, total + 1)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        positions = torch.arange(start, total, device=self.device)
        # The first chunk (or a whole prompt) is plain causal attention; a later chunk also sees the
        # cached prefix: query i may look at keys 0..start+i.
        visible = None if start == 0 else (torch.arange(total, device=self.device)[None, :] <= positions[:, None])
        h = self.weights.embed_rows(ids).to(self.dtype)  # [T, hidden]
        cos, sin = self._rope(h, positions, total)  # [T, 1, D]
        for index, layer in enumerate(self._layers):
            x = self._norm(h, layer.in_norm)
            q, k, v = self._project_qkv(x, layer, cos, sin)  # [T, H|KVH, D]
            keys, values = self._keys[index], self._values[index]
            keys[slot, :, start:total].copy_(k.transpose(0, 1))
            values[slot, :, start:total].copy_(v.transpose(0, 1))
            if visible is None:
                out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                     v.transpose(0, 1)[None], is_causal=True, enable_gqa=True)
            else:
                out = F.scaled_dot_product_attention(q.transpose(0, 1)[None],
                                                     keys[slot:slot + 1, :, :total].to(q.dtype),
                                                     values[slot:slot + 1, :, :total].to(q.dtype),
                                                     attn_mask=visible, enable_gqa=True)
            h = h + layer.o(out[0].transpose(0, 1).reshape(n, -1))
            h = h + self._mlp(self._norm(h, layer.post_norm), layer)
        self.lengths[slot] = total
        return self._logits(h if every_position else h[-1:])

    def staging(self) -> LlamaSlots:
        """A one-slot runner on the same weights, where a long prompt is prefilled chunk by chunk
        while this runner's rows keep decoding; ``adopt`` then moves its cache into a slot here."""
        return LlamaSlots(self._model, 1, self.device, self.weights.mode)

    def adopt(self, staging: LlamaSlots, slot: int) -> None:
        """Copy ``staging``'s slot 0 (a finished prefill) into ``slot`` of this runner."""
        n = staging.lengths[0]
        self.reserve(slot + 1, n + 1)
        for mine, theirs in zip(self._keys + self._values, staging._keys + staging._values, strict=True):
            mine[slot, :, :n].copy_(theirs[0, :, :n])
        self.lengths[slot] = n
        staging.free(0)

    def decode(self, token_ids: list[int]) -> torch.Tensor:
        """Feed one token to each of slots ``0..B-1`` (B = len(token_ids)); return logits [B, V]."""
        if self._fused:
            return self._decode_fused(token_ids)
        return self._decode_ops(token_ids)

    def _decode_ops(self, token_ids: list[int]) -> torch.Tensor:
        """``decode`` as PyTorch operations (dense and fp16; for q8 and q4 the reference the kernels are
        tested against)."""
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
        h = self.weights.embed_rows(ids).to(self.dtype)  # [B, hidden]
        cos, sin = self._rope(h, positions, max(lengths) + 1)
        for index, layer in enumerate(self._layers):
            x = self._norm(h, layer.in_norm)
            q, k, v = self._project_qkv(x, layer, cos, sin)  # [B, H|KVH, D]
            keys, values = self._keys[index], self._values[index]
            keys[row_index, :, positions] = k.to(keys.dtype)
            values[row_index, :, positions] = v.to(values.dtype)
            out = self._attend(q, keys[:rows, :, :span].to(q.dtype), values[:rows, :, :span].to(q.dtype), bias)
            h = h + layer.o(out)
            h = h + self._mlp(self._norm(h, layer.post_norm), layer)
        for slot in range(rows):
            self.lengths[slot] += 1
        return self._logits(h)

    def _decode_fused(self, token_ids: list[int]) -> torch.Tensor:
        """``decode`` with each layer in one C++ call (fused_decode.py): q8 and q4 weights."""
        rows = len(token_ids)
        lengths = self.lengths[:rows]
        self.reserve(rows, max(lengths) + 1)
        h = self.weights.embed_rows(torch.tensor(token_ids, dtype=torch.long, device=self.device)).to(self.dtype)
        cos, sin = (table[:, 0] for table in self._rope_tables(h, max(lengths) + 1))  # [L, D]: the kernel indexes
        for index, (weights, tail) in enumerate(self._fused_arguments):
            self._decode_layer(h, *weights, self._keys[index], self._values[index], lengths, cos, sin,  # type: ignore[misc]
                               self.heads, self.kv_heads, self.eps, *tail)
        for slot in range(rows):
            self.lengths[slot] += 1
        if self.weights.mode == "q4":  # its final norm in the kernel library too (q8 keeps its own arithmetic)
            return self._lm_head(torch.ops.proctor.rms_norm(h, self._final_norm, self.eps))
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
    def _rope(self, h: torch.Tensor, positions: torch.Tensor, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for ``positions`` ([N, 1, D]); ``needed``: the highest position + 1."""
        cos, sin = self._rope_tables(h, needed)
        return cos[positions], sin[positions]

    def _rope_tables(self, h: torch.Tensor, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos/sin tables [L, 1, D], filled by the rotary module once per growth (it is elementwise in
        the position, so a table row is the same bits as computing that position alone)."""
        if needed > self._rope_cos.shape[0]:
            table = torch.arange(_round_up(needed), device=self.device)
            cos, sin = self._rotary(h, table[None])
            self._rope_cos, self._rope_sin = cos[0][:, None, :], sin[0][:, None, :]
        return self._rope_cos, self._rope_sin

    def _norm(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x = h.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x.to(h.dtype)

    def _project_qkv(self, x: torch.Tensor, layer: LayerWeights, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, d = x.shape[0], self.head_dim
        heads = layer.qkv(x).view(n, -1, d)
        qk = _rotate(heads[:, :self.heads + self.kv_heads], cos, sin)  # q and k in one pass: the same bits
        return qk[:, :self.heads], qk[:, self.heads:], heads[:, self.heads + self.kv_heads:]

    def _mlp(self, x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        gate, up = layer.gate_up(x).chunk(2, dim=-1)
        return layer.down(F.silu(gate) * up)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self._lm_head(self._norm(h, self._final_norm)).float()


def _fused_arguments(layer: LayerWeights, mode: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A layer's weights as the decode kernel of ``mode`` takes them, and its trailing arguments (built
    once: a step makes 30 of these calls)."""
    products = (layer.qkv, layer.o, layer.gate_up, layer.down)
    handles = [p.blocks if mode == "q4" else p.packed for p in products]  # type: ignore[attr-defined]
    weights = (layer.in_norm, handles[0], handles[1], layer.post_norm, handles[2], handles[3])
    return weights, (() if mode == "q4" else (layer.qkv.reduce_range,))  # type: ignore[attr-defined]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _round_up(length: int) -> int:
    return -(-length // KV_GROWTH_TOKENS) * KV_GROWTH_TOKENS
