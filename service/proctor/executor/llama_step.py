"""A batched forward pass over a slot KV cache (continuous batching), for every family that
``executor/families.py`` describes: Llama, Mistral, Qwen2/2.5, Qwen3, Gemma 2/3 and Phi-3.

Why our own forward instead of the model's: transformers' caches share one write position across
the batch, so rows of different lengths need left padding that grows and has to be re-aligned each
time a request joins. Here every running request owns a *slot* (row ``i`` of a preallocated cache
per layer) with its own length: a decode step writes each row's new key/value at that row's own
position and attends over its own prefix (a per-row mask), so requests join after a batch-1
prefill into a free slot and leave by moving the last slot into the hole. No padding, no re-alignment.

The arithmetic is the model's own: its weights (q/k/v and gate/up fused into one matrix product each),
its rotary embedding module, its norms, biases, activation, windows and soft-capping as transformers
computes them (``slot_ops.py``), and ``scaled_dot_product_attention`` where nothing else applies. Tests
check logits against the model's own forward, family by family (tests/unit/test_families.py). The q4
C++ decode kernel computes every family's layer (``families.decodes_fused``), the q8 one Llama's
arithmetic only (``Family.plain``); dense and fp16 decode through PyTorch operations, batched all the same.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from proctor.executor import fused_decode
from proctor.executor.families import (
    EVERY_FAMILY_KERNELS,
    LENGTH_DEPENDENT_ROPE,
    Family,
    decodes_fused,
    describe,
    unsupported_reason,
    weights_problem,
)
from proctor.executor.invariance import slot_rows_own_bits
from proctor.executor.protocol import Capabilities, Feed
from proctor.executor.slot_cache import SlotCache, round_up
from proctor.executor.slot_ops import decode_biases, gate, prefill_visible, rms_norm, rotate, softcap
from proctor.executor.slot_weights import LayerWeights, slot_weights

# Decode attention runs over the longest row's length rounded up to this many positions. Rows see
# only their own prefix (the rest is masked), but the vectorised sums inside the matrix products and
# the softmax group elements by position; with the span a multiple of this block, padding only adds
# exact zeros to the same groups, so a row's result is bit-identical alone or next to a longer row
# (measured: lengths 3..700 all identical at 64, none at 1; tests/integration/test_batching_real.py).
ATTENTION_SPAN_BLOCK = 64
# The PyTorch-operations forward gathers each row's keys and values for its attention; it does so this many rows
# at a time, so a prompt fed as rows (hundreds of them) never holds hundreds of copies of its prefix at once.
ATTENTION_ROWS = 32


class LlamaSlots(SlotCache):
    """The model's weights plus a KV cache of ``max_slots`` rows, each with its own length."""

    def __init__(self, model: Any, max_slots: int, device: torch.device, weights: str = "dense",
                 calibration_ids: list[int] | None = None) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the slot forward does not support this model: {reason}")
        self.family = family = describe(model.config)
        problem = weights_problem(family, weights)
        if problem is not None:
            raise ValueError(problem)
        self.device = device
        self.heads, self.kv_heads, self.head_dim = family.heads, family.kv_heads, family.head_dim
        self.eps = family.eps
        self.max_slots = max_slots
        self._scale = family.attn_scale
        self._model = model
        self.weights = slot_weights(model, weights, calibration_ids)
        self._final_norm = self.weights.final_norm
        self._lm_head = self.weights.lm_head
        self._rotary = model.model.rotary_emb
        self._rope_tables_by_key: dict[str | None, tuple[torch.Tensor, torch.Tensor]] = {}
        self._windows = set(family.windows)
        self.dtype = self._final_norm.dtype  # the activations' dtype (q8 keeps its embedding table in fp16)
        self._layers = self.weights.layers
        # q8 and q4 decode through the C++ kernels (fused_decode.py), which take head sizes in multiples of
        # 8 and keep keys and values in float16: half the memory, and half the bytes a step reads over a
        # long prefix (both are approximate anyway; the other modes keep the model's dtype).
        self._fused = decodes_fused(family, weights)
        self._decode_layer = fused_decode.decode_layer(weights) if self._fused else None  # raises if it cannot load
        self._kernel_final_norm = _kernel_norm(self._final_norm, family)
        self._fused_arguments = [_fused_arguments(layer, weights, family, window)
                                 for layer, window in zip(self._layers, family.windows, strict=True)
                                 ] if self._fused else []
        SlotCache.__init__(self, len(self._layers), max_slots, self.kv_heads, self.head_dim,
                           torch.float16 if self._fused else self.dtype, device)
        self._vocab_width = int(model.config.vocab_size)  # the logits' width, learnt from logits (_head)

    @property
    def thread_invariant(self) -> bool:
        """A row's logits are the same bits at any intra-op thread count with oneDNN-packed or fbgemm
        weights (tests/integration/test_threads_real.py), so the engine may tune the count under load."""
        return self.weights.thread_invariant

    @property
    def capabilities(self) -> Capabilities:
        """On CPU every product, norm and attention is computed row by row, so a position's logits are its own
        (tests/unit/test_mixed_step.py): drafts, prompts in pieces of any size. On CUDA the libraries pick their
        kernels by the batch's shape, so nothing is known to keep a row's bits: no drafts there."""
        own = slot_rows_own_bits(self.device)
        return Capabilities(device=self.device, extend=own, split_prompts=True, spans=True, rows_own_bits=own,
                            thread_invariant=own and self.thread_invariant)

    def forward(self, feeds: Sequence[Feed]) -> torch.Tensor:
        """Every feed's tokens appended to its slot in one forward: each position a row of its own (slot,
        position), prompt pieces, decode rows and drafts alike; the logits of the positions the feeds want."""
        tokens: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        wanted: list[int] = []
        for feed in feeds:
            start, count = self.lengths[feed.slot], len(feed.tokens)
            if not 0 <= feed.logits <= count:
                raise ValueError(f"a feed of {count} tokens cannot return {feed.logits} positions' logits")
            wanted += range(len(tokens) + count - feed.logits, len(tokens) + count)
            tokens += feed.tokens
            slots += [feed.slot] * count
            positions += range(start, start + count)
        return self._forward_rows(tokens, slots, positions, wanted=wanted)

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
        visible = {window: prefill_visible(start, total, window, self.device) for window in self._windows}
        h = self._embed(ids)  # [T, hidden]
        rope = self._rope(h, positions, total)  # per rotary table: cos, sin [T, 1, D]
        for index, layer in enumerate(self._layers):
            x = self._norm(h, layer.in_norm)
            q, k, v = self._project_qkv(x, layer, *rope[self.family.rope_keys[index]])  # [T, H|KVH, D]
            keys, values = self._keys[index], self._values[index]
            keys[slot, :, start:total].copy_(k.transpose(0, 1))
            values[slot, :, start:total].copy_(v.transpose(0, 1))
            if start:  # a later chunk also sees the cached prefix
                k = keys[slot, :, :total].transpose(0, 1).to(q.dtype)
                v = values[slot, :, :total].transpose(0, 1).to(q.dtype)
            out = self._prefill_attention(q, k, v, visible[self.family.windows[index]])
            h = h + self._attention_out(out.reshape(n, -1), layer)
            h = h + self._mlp(self._norm(h, layer.post_norm), layer)
        self.lengths[slot] = total
        return self._logits(h if every_position else h[-1:])

    def _prefill_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           visible: torch.Tensor | None) -> torch.Tensor:
        """Attention of the prompt's queries [T, H, D] over keys and values [L, KVH, D]; ``visible``
        [T, L] (None: causal). Soft-capped scores (Gemma 2) are computed here; the rest by SDPA."""
        q, k, v = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
        family = self.family
        if family.attn_softcap is None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, is_causal=visible is None,
                                                 scale=family.scale_override, enable_gqa=True)
            return out[0].transpose(0, 1)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = softcap(torch.matmul(q, k.transpose(-1, -2)) * self._scale, family.attn_softcap)
        if visible is None:
            visible = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype), v)
        return out[0].transpose(0, 1)

    def decode(self, token_ids: list[int]) -> torch.Tensor:
        """Feed one token to each of slots ``0..B-1`` (B = len(token_ids)); return logits [B, V]."""
        rows = len(token_ids)
        return self._forward_rows(token_ids, list(range(rows)), self.lengths[:rows])

    def extend(self, feeds: list[list[int]]) -> torch.Tensor:
        """Feed ``feeds[i]`` (one or more tokens) to slot ``i`` for every ``i < len(feeds)`` in one forward;
        return every fed position's logits [sum of lengths, V], slot by slot.

        Each position is a row of its own (slot, position) in the same kernel a decode step runs, so its
        logits are the same bits one decode step per token gives (tests/unit/test_extend.py). The slots'
        lengths grow by their feeds; ``trim`` takes back the positions a verification rejects."""
        tokens: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        for slot, feed in enumerate(feeds):
            start = self.lengths[slot]
            tokens += feed
            slots += [slot] * len(feed)
            positions += range(start, start + len(feed))
        return self._forward_rows(tokens, slots, positions)

    def decode_ops(self, token_ids: list[int]) -> torch.Tensor:
        """``decode`` through the PyTorch operations whatever the mode (the reference the kernels are tested
        against)."""
        rows = len(token_ids)
        return self._forward_rows(token_ids, list(range(rows)), self.lengths[:rows], self._decode_ops)

    def _forward_rows(self, token_ids: list[int], slots: list[int], positions: list[int],
                      forward: RowForward | None = None, wanted: list[int] | None = None) -> torch.Tensor:
        """One forward where row ``r`` is token ``token_ids[r]`` at ``positions[r]`` of slot ``slots[r]``;
        every slot's length grows by its rows. The logits of rows ``wanted`` (None: every row)."""
        self.reserve(max(slots) + 1, max(positions) + 1)
        if forward is None:
            forward = self._decode_fused if self._fused else self._decode_ops
        if wanted is not None and len(wanted) == len(token_ids):
            wanted = None
        logits = forward(token_ids, slots, list(positions), wanted)
        for slot in slots:
            self.lengths[slot] += 1
        return logits

    def _decode_ops(self, token_ids: list[int], slots: list[int], positions: list[int],
                    wanted: list[int] | None = None) -> torch.Tensor:
        """A decode forward as PyTorch operations (dense and fp16, every family; for q8 and q4 on Llama's
        arithmetic the reference the kernels are tested against)."""
        rows = len(token_ids)
        span = -(-(max(positions) + 1) // ATTENTION_SPAN_BLOCK) * ATTENTION_SPAN_BLOCK
        self.reserve(max(slots) + 1, span)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        where = torch.tensor(positions, dtype=torch.long, device=self.device)
        plain = slots == list(range(rows))
        slot_index = torch.tensor(slots, dtype=torch.long, device=self.device)
        biases = decode_biases(where, span, self._windows, self.dtype)
        h = self._embed(ids)  # [B, hidden]
        rope = self._rope(h, where, max(positions) + 1)
        for index, layer in enumerate(self._layers):
            x = self._norm(h, layer.in_norm)
            q, k, v = self._project_qkv(x, layer, *rope[self.family.rope_keys[index]])  # [B, H|KVH, D]
            keys, values = self._keys[index], self._values[index]
            keys[slot_index, :, where] = k.to(keys.dtype)
            values[slot_index, :, where] = v.to(values.dtype)
            bias = biases[self.family.windows[index]]
            if plain and rows <= ATTENTION_ROWS:
                out = self._attend(q, keys[:rows, :, :span].to(q.dtype), values[:rows, :, :span].to(q.dtype), bias)
            else:
                out = torch.cat([self._attend(q[group], keys[slot_index[group], :, :span].to(q.dtype),
                                              values[slot_index[group], :, :span].to(q.dtype), bias[group])
                                 for group in (torch.arange(start, min(start + ATTENTION_ROWS, rows),
                                                            device=self.device)
                                               for start in range(0, rows, ATTENTION_ROWS))])
            h = h + self._attention_out(out, layer)
            h = h + self._mlp(self._norm(h, layer.post_norm), layer)
        return self._head(h, wanted)

    def _decode_fused(self, token_ids: list[int], slots: list[int], positions: list[int],
                      wanted: list[int] | None = None) -> torch.Tensor:
        """A decode forward with each layer in one C++ call (fused_decode.py): q8 and q4 weights."""
        h = self._embed(torch.tensor(token_ids, dtype=torch.long, device=self.device))
        tables = {key: tuple(table[:, 0] for table in self._rope_tables(h, max(positions) + 1, key))  # [L, D]
                  for key in set(self.family.rope_keys)}  # the kernel indexes them by position
        decode_layer = self._decode_layer
        assert decode_layer is not None  # _fused
        mapped = [] if slots == list(range(len(slots))) else slots
        for index, (weights, tail) in enumerate(self._fused_arguments):
            cos, sin = tables[self.family.rope_keys[index]]
            decode_layer(h, *weights, self._keys[index], self._values[index], positions, cos, sin,
                         self.heads, self.kv_heads, self.eps, *tail, slots=mapped)
        return self._head(h, wanted, kernel_norm=self.weights.mode in EVERY_FAMILY_KERNELS)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Decode attention as plain matrix products over a block-rounded span: unlike the fused CPU
        kernel (whose split of the work depends on the batch), a row's result then depends only on its
        own prefix (see ATTENTION_SPAN_BLOCK)."""
        rows, group = q.shape[0], self.heads // self.kv_heads
        q = q.view(rows, self.kv_heads, group, self.head_dim)
        scores = softcap(torch.matmul(q, keys.transpose(-1, -2)) * self._scale, self.family.attn_softcap) + bias
        out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(values.dtype), values)  # [B, KVH, G, D]
        return out.reshape(rows, self.heads * self.head_dim)

    # --- pieces -----------------------------------------------------------------------------------
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.weights.embed_rows(ids).to(self.dtype)
        if self.family.embed_scale is not None:  # Gemma: times √hidden, as a scalar of the activations' dtype
            h = h * torch.tensor(self.family.embed_scale, dtype=self.dtype)
        return h

    def _rope(self, h: torch.Tensor, positions: torch.Tensor,
              needed: int) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
        """cos/sin for ``positions`` ([N, 1, D]) from each rotary table the layers use (gathered once a step,
        not once a layer); ``needed``: the highest position + 1."""
        rope = {}
        for key in set(self.family.rope_keys):
            cos, sin = self._rope_tables(h, needed, key)
            rope[key] = (cos[positions], sin[positions])
        return rope

    def _rope_tables(self, h: torch.Tensor, needed: int, key: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos/sin tables [L, 1, D] (per layer type where the family has several), filled by the model's
        rotary module once per growth: it is elementwise in the position, so a table row is the same bits as
        computing that position alone. A rope whose frequencies depend on the sequence's length (dynamic,
        longrope) is computed per regime: positions below ``rope_original_length`` from a table no longer than
        that, the rest from the long one, so a row never depends on how long another row is."""
        tables = self._rope_tables_by_key.get(key)
        if tables is None or needed > tables[0].shape[0]:
            length = round_up(needed)
            cos, sin = self._rotary_call(h, length, key)
            short = self.family.rope_original_length
            if self.family.rope_type in LENGTH_DEPENDENT_ROPE and length > short:
                short_cos, short_sin = self._rotary_call(h, short, key)
                cos, sin = torch.cat((short_cos, cos[short:])), torch.cat((short_sin, sin[short:]))
            tables = self._rope_tables_by_key[key] = (cos[:, None, :], sin[:, None, :])
        return tables

    def _rotary_call(self, h: torch.Tensor, length: int, key: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(length, device=self.device)[None]
        cos, sin = self._rotary(h, positions) if key is None else self._rotary(h, positions, key)
        return cos[0], sin[0]

    def _norm(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(h, weight, self.family)

    def _project_qkv(self, x: torch.Tensor, layer: LayerWeights, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, d = x.shape[0], self.head_dim
        projected = layer.qkv(x)
        if layer.qkv_bias is not None:
            projected = projected + layer.qkv_bias
        heads = projected.view(n, -1, d)
        if layer.q_norm is not None and layer.k_norm is not None:  # per head, before the rotation (Qwen3, Gemma 3)
            q, k = self._norm(heads[:, :self.heads], layer.q_norm), self._norm(
                heads[:, self.heads:self.heads + self.kv_heads], layer.k_norm)
            return rotate(q, cos, sin), rotate(k, cos, sin), heads[:, self.heads + self.kv_heads:]
        qk = rotate(heads[:, :self.heads + self.kv_heads], cos, sin)  # q and k in one pass: the same bits
        return qk[:, :self.heads], qk[:, self.heads:], heads[:, self.heads + self.kv_heads:]

    def _attention_out(self, out: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        projected = layer.o(out)
        if layer.o_bias is not None:
            projected = projected + layer.o_bias
        return projected if layer.attn_out_norm is None else self._norm(projected, layer.attn_out_norm)

    def _mlp(self, x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        projected = layer.gate_up(x)
        if layer.gate_up_bias is not None:
            projected = projected + layer.gate_up_bias
        gate_part, up = projected.chunk(2, dim=-1)
        out = layer.down(gate(gate_part, self.family) * up)
        if layer.down_bias is not None:
            out = out + layer.down_bias
        return out if layer.mlp_out_norm is None else self._norm(out, layer.mlp_out_norm)

    def _head(self, h: torch.Tensor, wanted: list[int] | None, kernel_norm: bool = False) -> torch.Tensor:
        """The logits of rows ``wanted`` of ``h`` (None: all; none: [0, width] without running the head). With
        ``kernel_norm`` the final norm is the kernel library's (the q4 and gguf decode kernels; q8 its own)."""
        if wanted == []:
            return torch.empty(0, self._vocab_width, device=self.device)
        h = _rows(h, wanted)
        if kernel_norm:
            final = torch.ops.proctor.rms_norm(h, self._kernel_final_norm, self.eps)
            logits = softcap(self._lm_head(final), self.family.final_softcap)
        else:
            logits = self._logits(h)
        self._vocab_width = logits.shape[-1]
        return logits

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return softcap(self._lm_head(self._norm(h, self._final_norm)), self.family.final_softcap).float()


RowForward = Callable[[list[int], list[int], list[int], "list[int] | None"], torch.Tensor]


def _rows(h: torch.Tensor, wanted: list[int] | None) -> torch.Tensor:
    """The hidden states of rows ``wanted`` (None: all): the LM head runs only where logits are used."""
    if wanted is None:
        return h
    return h.index_select(0, torch.tensor(wanted, dtype=torch.long, device=h.device))


def _fused_arguments(layer: LayerWeights, mode: str, family: Family,
                     window: int | None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A layer's weights as the decode kernel of ``mode`` takes them, and its trailing arguments (built
    once: a step makes 30 of these calls): the family's extras (kernels/layer_step.h, LayerExtras)."""
    products: tuple[Any, ...] = (layer.qkv, layer.o, layer.gate_up, layer.down)
    norm = functools.partial(_kernel_norm, family=family)
    if mode == "gguf":  # each product as its blocks and ggml type; q, k, v (gate, up) as lists of parts
        qkv, o, gate_up, down = products
        weights: tuple[Any, ...] = (norm(layer.in_norm), qkv.blocks, qkv.types, o.blocks, o.ggml_type,
                                    norm(layer.post_norm), gate_up.blocks, gate_up.types, down.blocks, down.ggml_type)
    else:
        handles = [p.blocks if mode == "q4" else p.packed for p in products]
        weights = (norm(layer.in_norm), handles[0], handles[1], norm(layer.post_norm), handles[2], handles[3])
    scale = family.scale_override or 0.0  # 0: the kernel's own 1/sqrt(head_dim)
    extras = (layer.qkv_bias, norm(layer.q_norm), norm(layer.k_norm), window or 0, scale, family.attn_softcap or 0.0,
              norm(layer.attn_out_norm), norm(layer.mlp_out_norm), family.activation == "gelu_tanh",
              layer.o_bias, layer.gate_up_bias, layer.down_bias)
    return weights, (extras if mode in EVERY_FAMILY_KERNELS else (products[0].reduce_range, *extras))


def _kernel_norm(weight: torch.Tensor | None, family: Family) -> torch.Tensor | None:
    """A norm weight as the kernel takes it: Gemma's (1 + w) as the weight 1 + w (float32, contiguous)."""
    if weight is None:
        return None
    return (weight.float() + 1.0).contiguous() if family.norm_offset else weight
