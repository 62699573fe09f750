"""Random GGUF blocks of any ggml type with scales of a realistic size (gguf-py quantizes only some types)."""

from __future__ import annotations

import numpy as np

SCALE_AT = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # where each block's float16 scale(s) sit
MIN_AT = {"Q4_K": 2, "Q5_K": 2}


def random_blocks(ggml_type: int, rows: int, inputs: int, seed: int = 0) -> np.ndarray:
    """[rows, row bytes] of ``ggml_type``: random codes, scales of a realistic size."""
    import gguf
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    rng = np.random.default_rng(seed + ggml_type)
    kind = GGMLQuantizationType(ggml_type)
    if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
        values = rng.standard_normal((rows, inputs)).astype(np.float32)
        if kind == GGMLQuantizationType.F32:
            return values.view(np.uint8)
        return gguf.quants.quantize(values, kind).view(np.uint8)
    per_block, block_bytes = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, size=(rows, inputs // per_block, block_bytes), dtype=np.uint8)

    def half(at: int, low: float, high: float) -> None:
        values = rng.uniform(low, high, size=raw.shape[:2]).astype(np.float16)
        raw[..., at:at + 2] = values.view(np.uint8).reshape(*raw.shape[:2], 2)

    if kind.name in SCALE_AT:
        half(SCALE_AT[kind.name][0], 0.001, 0.02)
        if kind.name in MIN_AT:
            half(MIN_AT[kind.name], 0.001, 0.02)
    else:  # Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: d first (Q4_1/Q5_1 then m)
        half(0, 0.005, 0.05)
        if kind.name in ("Q4_1", "Q5_1"):
            half(2, -0.2, 0.2)
    return raw.reshape(rows, -1)
