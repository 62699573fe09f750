"""The slot forward: one batched forward over a slot KV cache (continuous batching), for every family that
``executor/families.py`` describes — Llama, Mistral, Qwen2/2.5, Qwen3, Gemma 2/3 and Phi-3 — with its strategies
(strategies.py: which products, which replay) chosen once, by the executor plan (plan.py).

Why our own forward instead of the model's: transformers' caches share one write position across
the batch, so rows of different lengths need left padding that grows and has to be re-aligned each
time a request joins. Here every running request owns a *slot* (row ``i`` of a preallocated cache
per layer) with its own length: a step writes each row's new key/value at that row's own position and
attends over its own prefix, so requests join into a free slot and leave by moving the last slot into the
hole. No padding, no re-alignment. Every fed position is a row of its own (slot, position): prompt pieces,
decode rows and drafts alike, in one forward.

The arithmetic is the model's own: its weights (q/k/v and gate/up fused into one matrix product each),
its rotary embedding module, its norms, biases, activation, windows and soft-capping as transformers
computes them (``slot_ops.py``). Tests check logits against the model's own forward, family by family
(tests/unit/test_families.py). The step runs one of:

- ``library`` products: PyTorch operations (dense and fp16 weights, or a family the C++ step lacks);
- ``kernels``: each layer one C++ call (q4 and gguf for every family, q8 for Llama's arithmetic:
  ``families.decodes_fused``);
- ``invariant`` products, or ``graphs`` replay: the Triton step (triton_step.py), tensors in and out, with the
  invariant kernels or the library's products, eager or replayed as CUDA graphs (graph_step.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from proctor.executor import fused_decode
from proctor.executor.families import (
    EVERY_FAMILY_KERNELS,
    Family,
    describe,
    unsupported_reason,
    weights_problem,
)
from proctor.executor.protocol import Capabilities, Feed
from proctor.executor.slot_cache import SlotCache
from proctor.executor.slot_ops import RotaryTables, decode_biases, gate, rms_norm, rotate, softcap
from proctor.executor.slot_weights import LayerWeights, slot_weights
from proctor.executor.strategies import (
    Capture,
    Products,
    Replay,
    built_capabilities,
    slot_capabilities,
    slot_products,
    strategy_problem,
)

# Decode attention runs over the longest row's length rounded up to this many positions. Rows see
# only their own prefix (the rest is masked), but the vectorised sums inside the matrix products and
# the softmax group elements by position; with the span a multiple of this block, padding only adds
# exact zeros to the same groups, so a row's result is bit-identical alone or next to a longer row
# (measured: lengths 3..700 all identical at 64, none at 1; tests/integration/test_batching_real.py).
ATTENTION_SPAN_BLOCK = 64
# The PyTorch-operations forward gathers each row's keys and values for its attention; it does so this many rows
# at a time, so a prompt fed as rows (hundreds of them) never holds hundreds of copies of its prefix at once.
ATTENTION_ROWS = 32

# Row ``r``: token ``ids[r]`` at ``positions[r]`` of slot ``slots[r]``; the logits of rows ``wanted`` (None: all).
RowForward = Callable[[list[int], list[int], list[int], "list[int] | None"], torch.Tensor]


class SlotForward(SlotCache):
    """The model's weights plus a KV cache of ``max_slots`` rows, each with its own length, and the step's
    strategies: ``products`` (None: the C++ layer step where it computes the family in ``weights`` mode, else the
    library's) and ``replay`` (``graphs``: steps padded to row buckets up to ``largest_bucket`` and replayed, each
    captured by ``capture``; None: as CUDA graphs on CUDA, eagerly elsewhere)."""

    def __init__(self, model: Any, max_slots: int, device: torch.device, weights: str = "dense",
                 calibration_ids: list[int] | None = None, products: Products | None = None,
                 replay: Replay = "eager", largest_bucket: int = 256, capture: Capture | None = None) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the slot forward does not support this model: {reason}")
        self.family = family = describe(model.config)
        self.products: Products = products or slot_products(family, weights)
        self.replay: Replay = replay
        problem = weights_problem(family, weights) or strategy_problem(model, family, weights, self.products, replay)
        if problem is not None:
            raise ValueError(problem)
        self.heads, self.kv_heads, self.head_dim = family.heads, family.kv_heads, family.head_dim
        self.eps = family.eps
        self.max_slots = max_slots
        self._scale = family.attn_scale
        self.weights = slot_weights(model, weights, calibration_ids)
        self._final_norm = self.weights.final_norm
        self._lm_head = self.weights.lm_head
        self.rotary = RotaryTables(model.model.rotary_emb, family, device)
        self._windows = set(family.windows)
        self.dtype = self._final_norm.dtype  # the activations' dtype (q8 keeps its embedding table in fp16)
        self._layers = self.weights.layers
        # The C++ layer step (fused_decode.py) takes head sizes in multiples of 8 and keeps keys and values in
        # float16: half the memory, and half the bytes a step reads over a long prefix (q8, q4 and gguf are
        # approximate anyway; the other strategies keep the model's dtype).
        fused = self.products == "kernels"
        self._decode_layer = fused_decode.decode_layer(weights) if fused else None  # raises if it cannot load
        self._kernel_final_norm = _kernel_norm(self._final_norm, family)
        self._fused_arguments = [_fused_arguments(layer, weights, family, window)
                                 for layer, window in zip(self._layers, family.windows, strict=True)
                                 ] if fused else []
        SlotCache.__init__(self, len(self._layers), max_slots, self.kv_heads, self.head_dim,
                           torch.float16 if fused else self.dtype, device)
        self._vocab_width = int(model.config.vocab_size)  # the logits' width, learnt from logits (_head)
        self.step = self._step(model, largest_bucket, capture)

    def _step(self, model: Any, largest_bucket: int, capture: Capture | None) -> RowForward:
        """The step's row forward for the chosen strategies (the Triton ones import triton: only where they run)."""
        if self.products == "kernels":
            return self._decode_fused
        if self.products == "library" and self.replay == "eager":
            return self._decode_ops
        from proctor.executor.triton_step import TritonStep

        triton = TritonStep(model, self.family, self.weights, self, self.rotary, self._embed,
                            invariant_products=self.products == "invariant")
        if self.replay == "eager":
            return triton
        from proctor.executor.graph_step import GraphReplay

        return GraphReplay(triton, largest_bucket, capture)

    @property
    def capabilities(self) -> Capabilities:
        """What the strategies offer on this device (strategies.slot_capabilities; on the CPU every position's
        logits are its own: tests/unit/test_mixed_step.py), with the thread count as the built weights allow (the
        same bits at any intra-op thread count with oneDNN-packed or fbgemm weights, tests/integration/
        test_threads_real.py: the engine may then tune the count under load)."""
        offered = slot_capabilities(self.device, self.products, self.replay)
        return built_capabilities(offered, self.products, self.weights.thread_invariant)

    def forward(self, feeds: Sequence[Feed]) -> torch.Tensor:
        """Every feed's tokens appended to its slot in one forward: each position a row of its own (slot,
        position), prompt pieces, decode rows and drafts alike; the logits of the positions the feeds want."""
        return self._forward_feeds(feeds, self.step)

    def forward_ops(self, feeds: Sequence[Feed]) -> torch.Tensor:
        """``forward`` through the PyTorch operations whatever the products (the reference the C++ layer step is
        tested against, on the same cache)."""
        return self._forward_feeds(feeds, self._decode_ops)

    def _forward_feeds(self, feeds: Sequence[Feed], step: RowForward) -> torch.Tensor:
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
        return self._forward_rows(tokens, slots, positions, step, wanted)

    def _forward_rows(self, token_ids: list[int], slots: list[int], positions: list[int], step: RowForward,
                      wanted: list[int]) -> torch.Tensor:
        """One forward where row ``r`` is token ``token_ids[r]`` at ``positions[r]`` of slot ``slots[r]``;
        every slot's length grows by its rows. The logits of rows ``wanted``."""
        self.reserve(max(slots) + 1, max(positions) + 1)
        logits = step(token_ids, slots, list(positions), None if len(wanted) == len(token_ids) else wanted)
        for slot in slots:
            self.lengths[slot] += 1
        return logits

    def _decode_ops(self, token_ids: list[int], slots: list[int], positions: list[int],
                    wanted: list[int] | None = None) -> torch.Tensor:
        """The rows as PyTorch operations (``library`` products: dense and fp16, every family; in the C++ step's
        modes the reference it is tested against)."""
        rows = len(token_ids)
        span = -(-(max(positions) + 1) // ATTENTION_SPAN_BLOCK) * ATTENTION_SPAN_BLOCK
        self.reserve(max(slots) + 1, span)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        where = torch.tensor(positions, dtype=torch.long, device=self.device)
        plain = slots == list(range(rows))
        slot_index = torch.tensor(slots, dtype=torch.long, device=self.device)
        biases = decode_biases(where, span, self._windows, self.dtype)
        h = self._embed(ids)  # [B, hidden]
        rope = self.rotary.at(h, where, max(positions) + 1)
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
        """The rows with each layer in one C++ call (``kernels`` products, fused_decode.py: q8, q4 and gguf)."""
        h = self._embed(torch.tensor(token_ids, dtype=torch.long, device=self.device))
        tables = {key: tuple(table[:, 0] for table in self.rotary.table(h, max(positions) + 1, key))  # [L, D]
                  for key in set(self.family.rope_keys)}  # the kernel indexes them by position
        decode_layer = self._decode_layer
        assert decode_layer is not None  # kernels products
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
