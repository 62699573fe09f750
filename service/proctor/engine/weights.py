"""How the slot forward multiplies by a weight matrix: dense, fp16 or int8 (``--weights``).

On CPU a decode step at a few rows costs what its weight bytes cost to stream from memory, so the
smaller the weights the faster the step. Measured per kernel at 1, 4, 16 and 32 rows
(``bench/weights.py``; bench/README.md) the candidates in torch 2.13 on x86 were:

- ``dense`` — the model's own dtype through oneDNN with prepacked weights (fp32 on CPU, the exact
  reference: what the tests compare with transformers' forward). On CUDA the only mode.
- ``fp16`` — fbgemm's fp16-weight GEMM (fp32 activations and sums): half the bytes, within ~2e-4 of
  fp32 (relative), 2–3× faster than dense at one row.
- ``q8`` — int8 weights per output channel through fbgemm's dynamic-quantized GEMM (AVX2 paths, the
  int8 path x86 PyTorch has shipped for years): a quarter of the bytes, 1.5–6× faster per product
  than dense at one row (the LM head gains most).
  fbgemm quantizes activations with one scale for the whole input, which would make a row's result
  depend on the rows beside it. So each row is first divided by its own largest magnitude and two
  constant columns ``+1, -1`` (with zero weights) are appended: every row then spans exactly
  ``[-1, 1]``, the tensor's quantization parameters are the same whatever the batch, the integer sums
  are exact, and the row's scale is multiplied back afterwards — per-row symmetric quantization, and a
  row's logits are the same bits alone or in any batch, at any thread count (tested).
  A q8 decode step runs each layer as one C++ call around the same packed weights (fused_decode.py:
  the ~60 small operations per layer cost more than the products at a few rows), with the KV cache and
  the embedding table in float16; prefill and the LM head use the functions here.

Not chosen: ``_weight_int8pack_mm`` and ``_weight_int4pack_mm_for_cpu`` (fast only for bf16
activations with AVX-512; scalar otherwise: 10–20× slower than dense here), ``torch._int_mm`` and
oneDNN's ``qlinear_pointwise`` capped at AVX2 (slower than dense), so the GGUF's Q4_1 blocks are not
run as such; ``q8`` re-quantizes their fp32 dequantization per channel.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from proctor.config import WEIGHT_MODES

CPU_PREFERENCE = ("q8", "fp16")  # what `auto` tries on CPU, fastest first (bench/weights.py, bench/README.md)
PACK_ROWS_HINT = 16  # oneDNN picks its blocked weight layout for about this many rows

Linear = Callable[[torch.Tensor], torch.Tensor]


def fbgemm_available() -> bool:
    """fbgemm (the fp16 and q8 kernels) needs an x86 CPU with AVX2."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def mode_problem(mode: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``mode`` cannot run here (None when it can)."""
    if mode not in WEIGHT_MODES:
        return f"unknown weights mode {mode!r}; expected auto, {', '.join(WEIGHT_MODES)}"
    if mode == "dense":
        return None
    if device.type != "cpu":
        return f"--weights {mode} is a CPU mode; on {device.type} use --weights dense (with --dtype)"
    if dtype != torch.float32:
        return f"--weights {mode} runs with float32 activations; use --dtype float32 (or auto)"
    if not fbgemm_available():
        return f"--weights {mode} needs fbgemm (an x86 CPU with AVX2); this machine has none"
    if mode == "q8":
        from proctor.engine.fused_decode import load_problem

        problem = load_problem()
        if problem is not None:
            return f"--weights q8: {problem}; use --weights fp16"
    return None


def make_linear(weight: torch.Tensor, mode: str, column_scale: torch.Tensor | None = None) -> Linear:
    """``x -> x @ (weight · diag(column_scale)).T`` in ``mode``; the returned function holds its own copy
    of the weight. (q8 scales the columns while it copies: no second full-size temporary.)"""
    weight = weight.detach().contiguous()
    if mode == "q8":
        return _Int8RowLinear(weight, column_scale)
    if column_scale is not None:
        weight = weight * column_scale[None, :]
    if mode == "fp16":
        return _Fp16Linear(weight)
    if weight.device.type == "cpu" and can_pack(weight.dtype):
        return _PackedLinear(weight)
    return _PlainLinear(weight)


@functools.cache
def _has_vnni() -> bool:
    """Whether int8 dot products sum in 32 bits (VNNI). Without it fbgemm's AVX2 kernels add pairs of
    u8·s8 products in 16 bits, which can saturate, so activations then keep 7 bits (``reduce_range``;
    measured on the default model: KL to dense 0.11 with 7 bits, 0.04 with 8)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def can_pack(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights of this type here (bf16 needs AVX-512 or AVX-NE-CONVERT)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros((8, 8), dtype=dtype), PACK_ROWS_HINT)
    except RuntimeError:
        return False
    return True


class _PlainLinear:
    """``F.linear`` (CUDA, or CPU dtypes oneDNN cannot pack)."""

    thread_invariant = False

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.nbytes = weight.numel() * weight.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class _PackedLinear:
    """oneDNN with the weight reordered once into its blocked layout: measured on the 2-core AVX2
    machine 1.6x faster than ``F.linear`` at one row and 1.4x at 16 (MKL repacks every weight on
    every call once there is more than one row), and, unlike MKL, a row's result does not depend on
    how many rows share the product or on the thread count."""

    thread_invariant = True

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS_HINT)
        self.nbytes = weight.numel() * weight.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], "")


class _Fp16Linear:
    """fbgemm's fp16-weight GEMM; its sums run over K in one order whatever the row count."""

    thread_invariant = True

    def __init__(self, weight: torch.Tensor) -> None:
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)
        self.nbytes = weight.numel() * 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)


class _Int8RowLinear:
    """int8 weights per output channel, activations quantized per row (see the module docstring)."""

    thread_invariant = True

    def __init__(self, weight: torch.Tensor, column_scale: torch.Tensor | None = None) -> None:
        out_features, self.in_features = weight.shape
        padded = torch.zeros(out_features, self.in_features + 2)
        if column_scale is None:
            padded[:, :self.in_features] = weight
        else:
            torch.mul(weight.float(), column_scale[None, :], out=padded[:, :self.in_features])
        scale = (torch.linalg.vector_norm(padded, float("inf"), dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        with warnings.catch_warnings():  # quantized tensors are deprecated; pinned torch still has them
            warnings.simplefilter("ignore")
            quantized = torch.quantize_per_channel(padded, scale.double(), torch.zeros(out_features, dtype=torch.long),
                                                   0, torch.qint8)
            del padded  # before packing: the LM head's is 113 MB
            self.packed = torch.ops.quantized.linear_prepack(quantized, None)
        self.nbytes = out_features * (self.in_features + 2) + out_features * 8
        self._local = threading.local()  # input buffers per thread (several engines may share the weights)
        self.reduce_range = not _has_vnni()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        peak = torch.linalg.vector_norm(x, float("inf"), dim=1, keepdim=True).clamp_(min=torch.finfo(x.dtype).tiny)
        spanned = self._spanned(x.shape[0])
        torch.div(x, peak, out=spanned[:, :self.in_features])
        return torch.ops.quantized.linear_dynamic(spanned, self.packed, self.reduce_range).mul_(peak)

    def _spanned(self, rows: int) -> torch.Tensor:
        """The input buffer for ``rows`` rows, its last two columns the constant ``+1, -1`` (reused:
        one thread's calls run one after another, each done with it on return)."""
        buffers: dict[int, torch.Tensor] = self._local.__dict__.setdefault("buffers", {})
        spanned = buffers.get(rows)
        if spanned is None:
            spanned = torch.empty(rows, self.in_features + 2)
            spanned[:, self.in_features] = 1.0
            spanned[:, self.in_features + 1] = -1.0
            buffers[rows] = spanned
        return spanned
