"""Matrix products on a GGUF file's own blocks (``--weights gguf``): the kernel in kernels/ggml_linear.cpp.

Why not dequantize at load (what transformers does): a Q4_K_M file holds ~4.8 bits a weight; as fp32 it
is 6.7× larger, so a 1B model needs ~5 GB and a 7B one does not fit this machine, and the load itself
takes minutes. Here a weight is the file's bytes, ``[out, row bytes]`` (a view of the memory-mapped file
where nothing has to change, so load time and resident memory track the file size), multiplied by the
activations quantized per block as llama.cpp quantizes them for that type. A row's result is the same bits
alone or in any batch, at any thread count (tests/unit/test_gguf_linear.py). One exception to the file's bytes as
they lie: a layer's Q4_K matrix is repacked at load eight rows to a group (``GgufLinear.grouped``), the same bits
by a faster loop at one to four activation rows, its file pages let go (models/gguf_layers.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

# ggml's type numbers (ggml.h) → (name, weights per block, bytes per block): the types with a product here.
BLOCK_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2),
    2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
}
Q4_K = 12
# Not a ggml type: Q4_K weights eight rows to a group, repacked at load (kernels/ggml_r8.h, ``repack_q4_k``).
Q4_K_R8 = 112
GROUP_ROWS = 8


def type_name(ggml_type: int) -> str:
    if ggml_type == Q4_K_R8:
        return "Q4_K (eight rows a group)"
    return BLOCK_TYPES[ggml_type][0] if ggml_type in BLOCK_TYPES else f"ggml type {ggml_type}"


class GgufLinear:
    """One weight matrix as its GGUF blocks: ``x -> x @ W.T`` and ``rows(ids)`` (token lookups)."""

    thread_invariant = True

    def __init__(self, blocks: torch.Tensor, ggml_type: int, in_features: int) -> None:
        if ggml_type not in BLOCK_TYPES and ggml_type != Q4_K_R8:
            raise ValueError(f"no product for {type_name(ggml_type)}")
        rows_each = GROUP_ROWS if ggml_type == Q4_K_R8 else 1  # weight rows a row of ``blocks`` holds
        _, per_block, block_bytes = BLOCK_TYPES[Q4_K if ggml_type == Q4_K_R8 else ggml_type]
        if blocks.dtype != torch.uint8 or blocks.dim() != 2 or in_features % per_block \
                or blocks.shape[1] != in_features // per_block * block_bytes * rows_each:
            raise ValueError(f"{type_name(ggml_type)} blocks of shape {tuple(blocks.shape)} do not hold "
                             f"{in_features} inputs a row")
        self.blocks = blocks
        self.ggml_type = ggml_type
        self.in_features = in_features
        self.out_features = blocks.shape[0] * rows_each
        self.nbytes = blocks.numel()

    def grouped(self) -> GgufLinear:
        """This Q4_K matrix repacked eight rows to a group (Q4_K_R8), when its rows come in eights; else itself.
        The same products to the bit, and at one to four activation rows a core runs them 1.2-1.5× faster
        (bench/q4k_repack.py); a copy of the blocks, so the file's pages can be let go."""
        if self.ggml_type != Q4_K or self.out_features % GROUP_ROWS:
            return self
        return GgufLinear(torch.ops.proctor.repack_q4_k(self.blocks, self.in_features), Q4_K_R8, self.in_features)

    @property
    def block_type(self) -> str:
        return type_name(self.ggml_type)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _product(x, [self.blocks], [self.ggml_type], self.in_features, self.out_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the weight as float32, as ggml dequantizes them."""
        rows = torch.ops.proctor.ggml_rows(self.blocks, self.ggml_type, self.in_features, ids.long().reshape(-1))
        return cast(torch.Tensor, rows)


class GgufStack:
    """Several matrices sharing one input, their outputs side by side: a file's separate q, k, v (or gate,
    up), each of its own block type as a Q4_K_M mix stores them. The decode kernel takes the parts."""

    thread_invariant = True

    def __init__(self, parts: Sequence[GgufLinear]) -> None:
        if not parts or len({part.in_features for part in parts}) != 1:
            raise ValueError("a stack needs matrices with the same number of inputs")
        self.parts = list(parts)
        self.blocks = [part.blocks for part in self.parts]
        self.types = [part.ggml_type for part in self.parts]
        self.in_features = self.parts[0].in_features
        self.out_features = sum(part.out_features for part in self.parts)
        self.nbytes = sum(part.nbytes for part in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """One kernel call: the shared input is quantized once for each activation form the parts take."""
        return _product(x, self.blocks, self.types, self.in_features, self.out_features)


def _product(x: torch.Tensor, blocks: list[torch.Tensor], types: list[int], in_features: int,
             out_features: int) -> torch.Tensor:
    flat = x.reshape(-1, in_features).float().contiguous()
    return cast(torch.Tensor, torch.ops.proctor.ggml_linear(flat, blocks, types).reshape(*x.shape[:-1], out_features))
