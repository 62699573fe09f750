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
    def __init__(self, model: Any, max_slots: int, device: torch.device) -> None:
        problem = invariant_step_problem(model, "dense")
        if problem is not None:
            raise ValueError(f"the batch-invariant step cannot serve this model: {problem}")
        super().__init__(model, max_slots, device, "dense")
        self._matrices = [_matrices(weights, layer) for weights, layer in zip(self._layers, model.model.layers,
                                                                               strict=True)]
        head = plain_weight(self._lm_head)
        self._head_matrix = head if head is not None else model.lm_head.weight.detach()

    @property
    def capabilities(self) -> Capabilities:
        """Every row its own bits on any device: drafts and prompts in pieces everywhere."""
        return Capabilities(device=self.device, extend=True, split_prompts=True, spans=True, rows_own_bits=True,
                            thread_invariant=True)

    def _forward_rows(self, token_ids: list[int], slots: list[int], positions: list[int],
                      forward: RowForward | None = None, wanted: list[int] | None = None) -> torch.Tensor:
        return super()._forward_rows(token_ids, slots, positions, self._decode_invariant, wanted)

    def _decode_invariant(self, token_ids: list[int], slots: list[int], positions: list[int],
                          wanted: list[int] | None = None) -> torch.Tensor:
        """Row ``r``: token ``token_ids[r]`` at ``positions[r]`` of slot ``slots[r]``. Every row's keys and values
        are written first, then each row attends to its slot's first ``positions[r] + 1`` positions."""
        rows, dtype = len(token_ids), self.dtype
        self.reserve(max(slots) + 1, max(positions) + 1)
        where = torch.tensor(positions, dtype=torch.long, device=self.device)
        slot_index = torch.tensor(slots, dtype=torch.long, device=self.device)
        h = self._embed(torch.tensor(token_ids, dtype=torch.long, device=self.device))
        cos, sin = self._rope(h, where, max(positions) + 1)[self.family.rope_keys[0]]
        for index, (layer, matrices) in enumerate(zip(self._layers, self._matrices, strict=True)):
            x = kernels.rms_norm(h, layer.in_norm, self.eps).to(dtype)
            heads = kernels.matmul(x, matrices.qkv).to(dtype).view(rows, -1, self.head_dim)
            qk = rotate(heads[:, :self.heads + self.kv_heads], cos, sin)
            keys, values = self._keys[index], self._values[index]
            keys[slot_index, :, where] = qk[:, self.heads:].to(keys.dtype)
            values[slot_index, :, where] = heads[:, self.heads + self.kv_heads:].to(values.dtype)
            out = kernels.decode_attention(qk[:, :self.heads], keys, values, slot_index, where + 1).to(dtype)
            h = h + kernels.matmul(out.reshape(rows, -1), matrices.o).to(dtype)
            x = kernels.rms_norm(h, layer.post_norm, self.eps).to(dtype)
            gate_part, up = kernels.matmul(x, matrices.gate_up).to(dtype).chunk(2, dim=-1)
            h = h + kernels.matmul(gate(gate_part, self.family) * up, matrices.down).to(dtype)
        if wanted == []:
            return torch.empty(0, self._vocab_width, device=self.device)
        h = h if wanted is None else h[wanted]
        return kernels.matmul(kernels.rms_norm(h, self._final_norm, self.eps).to(dtype), self._head_matrix)


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
