"""The slot forward with every product, norm and attention a batch-invariant kernel (issue 43).

Why: on CUDA the slot forward's products, norms and attention are the libraries', which pick their kernels by
the batch's shape, so a row's logits depend on the rows beside it (executor/invariance.py). ``InvariantSlots``
is the same forward — every position a row of its own, prompts, decode rows and drafts in one step — with those
three operations taken by executor/invariant_kernels.py, whose reduction order never depends on the batch. The
rest of the step is elementwise (embedding rows, rotary, the gate, residual adds, the cache write), so a row's
logits are its own bits on any device.

It serves Llama's arithmetic exactly (``Family.plain``: Llama, Mistral, and the families configured like
them); the others are refused by name. On the CPU it runs under Triton's interpreter: slow, and there for the
tests, which hold it to the PyTorch step and to each row's bits alone and in any batch
(tests/unit/test_invariant_step.py). Bucketed CUDA graphs over it are the next part of issue 43.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from proctor.executor import invariant_kernels as kernels
from proctor.executor.invariance import invariant_step_problem
from proctor.executor.llama_step import LlamaSlots, RowForward
from proctor.executor.protocol import Capabilities
from proctor.executor.slot_ops import gate, rotate
from proctor.executor.slot_weights import LayerWeights
from proctor.executor.weights import plain_weight


@dataclass(frozen=True)
class _Matrices:
    """One layer's projections as plain [outputs, inputs] tensors, the kernels' operand."""

    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


class InvariantSlots(LlamaSlots):
    """``invariant``: products and norms by the kernels (every row its own bits); False: by PyTorch (cuBLAS on
    CUDA: faster, the batch's shape picks the kernel), the attention the kernel's either way (the graphed step,
    executor/graph_step.py, serves both modes through ``rows_hidden``)."""

    def __init__(self, model: Any, max_slots: int, device: torch.device, invariant: bool = True) -> None:
        problem = invariant_step_problem(model, "dense")
        if problem is not None:
            raise ValueError(f"the batch-invariant step cannot serve this model: {problem}")
        super().__init__(model, max_slots, device, "dense")
        self.invariant = invariant
        self._matrices = [_matrices(weights, layer) for weights, layer in zip(self._layers, model.model.layers,
                                                                               strict=True)]
        head = plain_weight(self._lm_head)
        self._head_matrix = head if head is not None else model.lm_head.weight.detach()
        self._rope_key = self.family.rope_keys[0]

    @property
    def capabilities(self) -> Capabilities:
        """Every row its own bits on any device with the kernels' products: drafts and prompts in pieces
        everywhere. With PyTorch's products on plain matrices (the library picks its kernel by the rows) nothing is
        known to keep a row's bits, on any device: no drafts."""
        own = self.invariant
        return Capabilities(device=self.device, extend=own, split_prompts=True, spans=True, rows_own_bits=own,
                            thread_invariant=own)

    def _forward_rows(self, token_ids: list[int], slots: list[int], positions: list[int],
                      forward: RowForward | None = None, wanted: list[int] | None = None) -> torch.Tensor:
        return super()._forward_rows(token_ids, slots, positions, self._decode_invariant, wanted)

    def _decode_invariant(self, token_ids: list[int], slots: list[int], positions: list[int],
                          wanted: list[int] | None = None) -> torch.Tensor:
        """Row ``r``: token ``token_ids[r]`` at ``positions[r]`` of slot ``slots[r]``."""
        self.ready_for(max(slots) + 1, max(positions) + 1)
        ids, slot_index, where = (torch.tensor(values, dtype=torch.long, device=self.device)
                                  for values in (token_ids, slots, positions))
        if wanted == []:
            return torch.empty(0, self._vocab_width, device=self.device)
        h = self.rows_hidden(ids, slot_index, where, where + 1)
        return self.head(h if wanted is None else h[wanted])

    def ready_for(self, rows: int, length: int) -> None:
        """The cache and the rotary table grown for ``rows`` slots of ``length`` positions: ``rows_hidden`` then
        allocates nothing that outlives it (what a captured CUDA graph needs)."""
        self.reserve(rows, length)
        self._rope_tables(self._final_norm, length, self._rope_key)

    def rows_hidden(self, ids: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                    lengths: torch.Tensor) -> torch.Tensor:
        """Row ``r``: token ``ids[r]`` written at ``positions[r]`` of slot ``slots[r]``, then attending to that
        slot's first ``lengths[r]`` positions (``positions[r] + 1`` for a real row); every row's last hidden state.
        Tensors in, tensors out, nothing read back to the host: a CUDA graph captures it (``ready_for`` first)."""
        dtype, matmul, norm = self.dtype, self._matmul, self._norm_rows
        rows = ids.shape[0]
        cos, sin = (table[positions] for table in self._rope_tables_by_key[self._rope_key])
        h = self._embed(ids)
        for index, (layer, matrices) in enumerate(zip(self._layers, self._matrices, strict=True)):
            heads = matmul(norm(h, layer.in_norm), matrices.qkv).view(rows, -1, self.head_dim)
            qk = rotate(heads[:, :self.heads + self.kv_heads], cos, sin)
            keys, values = self._keys[index], self._values[index]
            keys[slots, :, positions] = qk[:, self.heads:].to(keys.dtype)
            values[slots, :, positions] = heads[:, self.heads + self.kv_heads:].to(values.dtype)
            out = kernels.decode_attention(qk[:, :self.heads], keys, values, slots, lengths).to(dtype)
            h = h + matmul(out.reshape(rows, -1), matrices.o)
            gate_part, up = matmul(norm(h, layer.post_norm), matrices.gate_up).chunk(2, dim=-1)
            h = h + matmul(gate(gate_part, self.family) * up, matrices.down)
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """The float32 logits of hidden states ``h`` (the kernels' product is float32 already)."""
        x = self._norm_rows(h, self._final_norm)
        if self.invariant:
            return kernels.matmul(x, self._head_matrix)
        return torch.nn.functional.linear(x, self._head_matrix).float()

    def _matmul(self, x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
        if self.invariant:
            return kernels.matmul(x, matrix).to(self.dtype)
        return torch.nn.functional.linear(x, matrix)

    def _norm_rows(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.invariant:
            return kernels.rms_norm(h, weight, self.eps).to(self.dtype)
        return self._norm(h, weight)


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
