"""The slot forward's rows through Triton's attention, tensors in and tensors out (issue 43): the step under the
``invariant`` products and under ``graphs`` replay (strategies.py).

Why: on CUDA the slot forward's products, norms and attention are the libraries', which pick their kernels by
the batch's shape, so a row's logits depend on the rows beside it (strategies.slot_capabilities). With
``invariant_products`` every product, norm and attention is a kernel of executor/invariant_kernels.py, whose
reduction order never depends on the batch; the rest of the step is elementwise (embedding rows, rotary, the gate,
residual adds, the cache write), so a row's logits are its own bits on any device. Without, the products and norms
are the library's (cuBLAS on CUDA: faster, the batch's shape picks the kernel) and only the attention is the
kernel's: what the graphed step runs under ``--batch-invariant auto``. Either way nothing is read back to the host,
so a CUDA graph captures the step (graph_step.py).

It serves Llama's arithmetic exactly (``Family.plain``: Llama, Mistral, and the families configured like
them); the others are refused by name (strategies.triton_step_problem). On the CPU it runs under Triton's
interpreter: slow, and there for the tests, which hold it to the PyTorch step and to each row's bits alone and in
any batch (tests/unit/test_invariant_step.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from proctor.executor import invariant_kernels as kernels
from proctor.executor.families import Family
from proctor.executor.slot_cache import SlotCache
from proctor.executor.slot_ops import RotaryTables, gate, rms_norm, rotate
from proctor.executor.slot_weights import LayerWeights, SlotWeights
from proctor.executor.weights import plain_weight


@dataclass(frozen=True)
class _Matrices:
    """One layer's projections as plain [outputs, inputs] tensors, the kernels' operand."""

    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


class TritonStep:
    """The rows of a slot forward (its ``weights``, ``cache`` and ``rotary`` tables, its ``embed``) through Triton's
    attention, products and norms by the invariant kernels with ``invariant_products``, else by the library."""

    def __init__(self, model: Any, family: Family, weights: SlotWeights, cache: SlotCache, rotary: RotaryTables,
                 embed: Callable[[torch.Tensor], torch.Tensor], invariant_products: bool) -> None:
        self.family = family
        self.cache = cache
        self.rotary = rotary
        self.invariant_products = invariant_products
        self._embed = embed
        self._layers = weights.layers
        self._final_norm = weights.final_norm
        self._device = cache.device
        self.dtype = self._final_norm.dtype
        self._matrices = [_matrices(layer_weights, layer) for layer_weights, layer in zip(
            self._layers, model.model.layers, strict=True)]
        head = plain_weight(weights.lm_head)
        self._head_matrix = head if head is not None else model.lm_head.weight.detach()
        self.rope_key = family.rope_keys[0]
        self._vocab_width = int(model.config.vocab_size)

    def __call__(self, token_ids: list[int], slots: list[int], positions: list[int],
                 wanted: list[int] | None = None) -> torch.Tensor:
        """Row ``r``: token ``token_ids[r]`` at ``positions[r]`` of slot ``slots[r]``; the logits of rows ``wanted``
        (None: all)."""
        self.ready_for(max(slots) + 1, max(positions) + 1)
        ids, slot_index, where = (torch.tensor(values, dtype=torch.long, device=self._device)
                                  for values in (token_ids, slots, positions))
        if wanted == []:
            return torch.empty(0, self._vocab_width, device=self._device)
        h = self.rows_hidden(ids, slot_index, where, where + 1)
        return self.head(h if wanted is None else h[wanted])

    def ready_for(self, rows: int, length: int) -> None:
        """The cache and the rotary table grown for ``rows`` slots of ``length`` positions: ``rows_hidden`` then
        allocates nothing that outlives it (what a captured CUDA graph needs)."""
        self.cache.reserve(rows, length)
        self.rotary.table(self._final_norm, length, self.rope_key)

    def rows_hidden(self, ids: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                    lengths: torch.Tensor) -> torch.Tensor:
        """Row ``r``: token ``ids[r]`` written at ``positions[r]`` of slot ``slots[r]``, then attending to that
        slot's first ``lengths[r]`` positions (``positions[r] + 1`` for a real row); every row's last hidden state.
        Tensors in, tensors out, nothing read back to the host: a CUDA graph captures it (``ready_for`` first)."""
        family, dtype, matmul, norm = self.family, self.dtype, self._matmul, self._norm_rows
        rows = ids.shape[0]
        cos, sin = (table[positions] for table in self.rotary.by_key[self.rope_key])
        h = self._embed(ids)
        for index, (layer, matrices) in enumerate(zip(self._layers, self._matrices, strict=True)):
            heads = matmul(norm(h, layer.in_norm), matrices.qkv).view(rows, -1, family.head_dim)
            qk = rotate(heads[:, :family.heads + family.kv_heads], cos, sin)
            keys, values = self.cache.layer(index)
            keys[slots, :, positions] = qk[:, family.heads:].to(keys.dtype)
            values[slots, :, positions] = heads[:, family.heads + family.kv_heads:].to(values.dtype)
            out = kernels.decode_attention(qk[:, :family.heads], keys, values, slots, lengths).to(dtype)
            h = h + matmul(out.reshape(rows, -1), matrices.o)
            gate_part, up = matmul(norm(h, layer.post_norm), matrices.gate_up).chunk(2, dim=-1)
            h = h + matmul(gate(gate_part, family) * up, matrices.down)
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """The float32 logits of hidden states ``h`` (the kernels' product is float32 already)."""
        x = self._norm_rows(h, self._final_norm)
        if self.invariant_products:
            return kernels.matmul(x, self._head_matrix)
        return torch.nn.functional.linear(x, self._head_matrix).float()

    def _matmul(self, x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
        if self.invariant_products:
            return kernels.matmul(x, matrix).to(self.dtype)
        return torch.nn.functional.linear(x, matrix)

    def _norm_rows(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.invariant_products:
            return kernels.rms_norm(h, weight, self.family.eps).to(self.dtype)
        return rms_norm(h, weight, self.family)


def _matrices(weights: LayerWeights, layer: Any) -> _Matrices:
    """The layer's matrices: the slot weights' own where they are plain (CUDA: no second copy on the device), else
    the model's (on the CPU the slot weights are packed for oneDNN)."""
    attention, mlp = layer.self_attn, layer.mlp

    def matrix(linear: object, *parts: torch.Tensor) -> torch.Tensor:
        plain = plain_weight(linear)
        if plain is not None:
            return plain
        return parts[0].detach() if len(parts) == 1 else torch.cat([part.detach() for part in parts])

    return _Matrices(
        qkv=matrix(weights.qkv, attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight),
        o=matrix(weights.o, attention.o_proj.weight), gate_up=matrix(weights.gate_up, mlp.gate_proj.weight,
                                                                     mlp.up_proj.weight),
        down=matrix(weights.down, mlp.down_proj.weight))
