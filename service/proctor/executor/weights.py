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

- ``q4`` — the GGUF's own blocks (``BlockLinear``): Q4_1 layers, Q8_0 LM head, through our kernel
  (kernels/q4_decode.cpp, q4_dot.h): fewer bytes than q8 and, since the blocks are the file's, closer
  to dense; faster than q8 at every batch size measured (bench/README.md, "Weight modes"). The CPU
  default.
- ``gguf`` — a ``.gguf`` file served from its own blocks, whatever their types (Q4_K_M's mix, Q8_0, F16,
  …): gguf_linear.py. The default for a ``.gguf`` model on CPU; other modes load such a file through
  transformers, which dequantizes it to fp32 first.

Not chosen for the blocks: ``_weight_int8pack_mm`` and ``_weight_int4pack_mm_for_cpu`` (fast only for
bf16 activations with AVX-512; scalar otherwise: 10–20× slower than dense here), ``torch._int_mm`` and
oneDNN's ``qlinear_pointwise`` capped at AVX2 (slower than dense): hence a kernel of our own.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F

from proctor.config import WEIGHT_MODES

CPU_PREFERENCE = ("q4", "q8", "fp16")  # what `auto` tries on CPU, fastest first (bench/weights.py, bench/README.md)
PACK_ROWS_HINT = 16  # oneDNN picks its blocked weight layout for about this many rows

Linear = Callable[[torch.Tensor], torch.Tensor]
BLOCK_INPUTS = 32  # q4: inputs per GGUF block
GROUP_ROWS = 8  # q4: output rows stored interleaved (kernels/q4_types.h)


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
    if mode in ("q8", "q4", "gguf"):
        from proctor.executor.fused_decode import load_problem

        problem = load_problem()
        if problem is not None:
            return f"--weights {mode}: {problem}; use --weights fp16"
    return None


def make_linear(weight: torch.Tensor, mode: str, column_scale: torch.Tensor | None = None,
                head: bool = False) -> Linear:
    """``x -> x @ (weight · diag(column_scale)).T`` in ``mode``; the returned function holds its own copy
    of the weight. (q8 scales the columns while it copies: no second full-size temporary.) ``head``:
    the LM head, which q4 keeps in 8-bit blocks as the GGUF does."""
    weight = weight.detach().contiguous()
    if mode == "q4":
        return BlockLinear(weight, "q8_0" if head else "q4_1")
    if mode == "q8":
        return _Int8RowLinear(weight, column_scale)
    if column_scale is not None:
        weight = weight * column_scale[None, :]
    if mode == "fp16":
        return _Fp16Linear(weight)
    if weight.device.type == "cpu" and can_pack(weight.dtype):
        return _PackedLinear(weight)
    return _PlainLinear(weight)


def plain_weight(linear: object) -> torch.Tensor | None:
    """The [outputs, inputs] matrix a linear multiplies as it is (``F.linear``: CUDA, or a dtype oneDNN does not
    pack), else None (packed, quantized or blocked): what another kernel may multiply without a copy of its own."""
    return linear.weight if isinstance(linear, _PlainLinear) else None


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
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]  # third-party typing
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
        return cast(torch.Tensor, torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], ""))


class _Fp16Linear:
    """fbgemm's fp16-weight GEMM; its sums run over K in one order whatever the row count."""

    thread_invariant = True

    def __init__(self, weight: torch.Tensor) -> None:
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)
        self.nbytes = weight.numel() * 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, torch.ops.quantized.linear_dynamic_fp16(x, self.packed))


class BlockLinear:
    """Weights in llama.cpp's blocks of 32 inputs, multiplied by the q4 kernel (kernels/q4_decode.cpp,
    which also says how a row's blocks are laid out):
    ``q4_1`` (4-bit codes, a float16 scale and minimum per block: 5 bits a weight) for the layers and
    ``q8_0`` (8-bit codes, a float16 scale: 8.5 bits) for the LM head, the formats of the default
    model's GGUF. Quantized with ggml's own reference rounding from the model's weights, which for that
    GGUF are its dequantized blocks, so this gives back the file's blocks and the weights are exactly
    the file's (tests/integration/test_q4_weights_real.py). Activations are quantized per row and per
    block of 32 to int8 and each block's sum is exact in integers, so a row's result is the same bits
    alone or in any batch, at any thread count."""

    thread_invariant = True

    def __init__(self, weight: torch.Tensor, block_format: str) -> None:
        from proctor.executor.fused_decode import load_problem

        problem = load_problem()
        if problem is not None:
            raise RuntimeError(f"--weights q4: {problem}")
        self.out_features, self.in_features = weight.shape
        if self.in_features % BLOCK_INPUTS or self.out_features % GROUP_ROWS:
            raise ValueError(f"--weights q4 needs input sizes in multiples of {BLOCK_INPUTS} and output sizes in "
                             f"multiples of {GROUP_ROWS}, got {self.out_features}x{self.in_features}")
        self.block_format = block_format
        quantize = torch.ops.proctor.quantize_q4_1 if block_format == "q4_1" else torch.ops.proctor.quantize_q8_0
        self.blocks = quantize(weight.float().contiguous())
        self._product = torch.ops.proctor.q4_linear if block_format == "q4_1" else torch.ops.proctor.q8_0_linear
        self.nbytes = self.blocks.numel()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self._product(x.contiguous(), self.blocks))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """``dequantized_rows(ids)`` (the same values), in one kernel call for q8_0: token lookups."""
        if self.block_format == "q8_0":
            return cast(torch.Tensor, torch.ops.proctor.q8_0_rows(self.blocks, ids.long().contiguous()))
        return self.dequantized_rows(ids)

    def dequantized_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the weight as float32, exactly as the blocks hold them (in PyTorch operations)."""
        scale, minimum, codes = self._unpack(self.blocks[torch.div(ids, GROUP_ROWS, rounding_mode="floor")])
        lane = (ids % GROUP_ROWS).view(-1, 1, 1).expand(-1, 1, scale.shape[-1])
        pick = (lambda t: t.gather(1, lane).squeeze(1))  # noqa: E731 - [N, 8, blocks] → row `lane`: [N, blocks]
        codes = codes.gather(1, lane[..., None].expand(-1, 1, scale.shape[-1], BLOCK_INPUTS)).squeeze(1)
        values = pick(scale)[..., None] * codes.float()  # type: ignore[no-untyped-call]  # third-party typing
        if minimum is not None:
            values = values + pick(minimum)[..., None]  # type: ignore[no-untyped-call]  # third-party typing
        return cast(torch.Tensor, values.reshape(ids.numel(), self.in_features))

    def ggml_blocks(self) -> torch.Tensor:
        """The blocks as ggml lays them out (per row, each block's scale, minimum and 16 bytes of paired
        4-bit codes, or scale and 32 int8 codes), as a GGUF file stores them: [out, blocks · bytes]."""
        scale, minimum, codes = self._unpack(self.blocks)
        rows = self.out_features
        halves = [scale.reshape(rows, -1, 1)] + ([] if minimum is None else [minimum.reshape(rows, -1, 1)])
        head = torch.cat(halves, dim=-1).half().contiguous().view(torch.uint8)  # [out, blocks, 2 or 4]: float16 bytes
        codes = codes.reshape(rows, -1, BLOCK_INPUTS)
        if minimum is not None:  # element i in the low nibble of byte i, element i + 16 in its high nibble
            codes = codes[..., :16] | (codes[..., 16:] << 4)
        return torch.cat([head, codes.to(torch.uint8)], dim=-1).reshape(rows, -1)

    def _unpack(self, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Groups of 8 rows (kernels/q4_decode.cpp: ``quantize`` says where each byte goes) as scales and
        minimums [G, 8, blocks] (float32) and codes [G, 8, blocks, 32] (uint8 for q4_1, int8 for q8_0)."""
        count, blocks = groups.shape[0], self.in_features // BLOCK_INPUTS
        q4 = self.block_format == "q4_1"

        def halves(start: int) -> torch.Tensor:  # [G, blocks, 8] float16 → [G, 8, blocks] float32
            part = groups[:, start:start + 16 * blocks].contiguous().view(torch.float16)
            return part.view(count, blocks, GROUP_ROWS).transpose(1, 2).float()

        scale = halves(0)
        minimum = halves(16 * blocks) if q4 else None
        raw = groups[:, (32 if q4 else 16) * blocks:]
        if q4:  # [G, blocks, 4 (c), 8 (lane), 4 (e)]: c's codes in the low nibbles, c + 4's in the high
            packed = raw.reshape(count, blocks, 4, GROUP_ROWS, 4)
            quads = torch.cat([packed & 0x0F, packed >> 4], dim=2)
        else:
            quads = raw.contiguous().view(torch.int8).reshape(count, blocks, 8, GROUP_ROWS, 4)
        codes = quads.permute(0, 3, 1, 2, 4).reshape(count, GROUP_ROWS, blocks, BLOCK_INPUTS)
        return scale, minimum, codes


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
        product = torch.ops.quantized.linear_dynamic(spanned, self.packed, self.reduce_range)
        return cast(torch.Tensor, product.mul_(peak))

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
