"""Batch-invariant kernels (issue 43): products, norms and decode attention whose every row is the same bits
whatever else shares the launch, in Triton.

Why: cuBLAS and the fused attention kernels pick their tiling and split the reduction by the batch's shape, so a
row's logits change with the number of rows beside it (on the lent H200, request 0 alone and among 16 diverged at
token 20), and replay, the audit trail's strongest promise, fails on the device most users run. These kernels
fix the reduction order per row, as vLLM's ``VLLM_BATCH_INVARIANT`` and the Thinking Machines kernels do:

- ``matmul``: one tile shape for every launch (``TILE_M`` × ``TILE_N``, ``TILE_K`` deep), no split along K, the K
  loop in order. A row only ever meets its own inputs; the rows beside it in a tile are separate rows of the
  same dot, padded with zeros when the batch is short.
- ``rms_norm``: one program a row, its sum of squares over fixed chunks of ``NORM_CHUNK`` inputs.
- ``decode_attention``: one program a (row, head), the row's own prefix in fixed chunks of ``ATTENTION_SPLIT``
  positions with an online softmax in position order: no split that depends on how long the other rows are.

On a machine without CUDA the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set here before
triton is imported: its own library functions are kernels too), so CI checks their arithmetic against PyTorch
and their invariance without a GPU (tests/unit/test_invariant_kernels.py). The interpreter has no bfloat16 dot,
so there the tiles are widened to float32 before the dot (``WIDEN``: products of bfloat16 values are exact in
float32 either way).
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":  # its own kernels are compiled ones
        raise ImportError("triton was imported before the kernels could choose its interpreter (no CUDA here): "
                          "set TRITON_INTERPRET=1, or import proctor.executor.invariant_kernels first")
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # after the interpreter is chosen: triton reads it as its kernels are defined
import triton.language as tl

TILE_M, TILE_N, TILE_K = 16, 64, 64  # one tile shape for every launch: the reduction order of every row
NORM_CHUNK = 256  # inputs a norm sums at a time
ATTENTION_SPLIT = 64  # positions attention takes at a time, whatever the other rows' lengths
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _matmul_kernel(x_ptr, w_ptr, y_ptr, rows, outputs, inputs, x_row, w_row, y_row,
                   TM: tl.constexpr, TN: tl.constexpr, TK: tl.constexpr, WIDEN: tl.constexpr):
    m = tl.program_id(0) * TM + tl.arange(0, TM)
    n = tl.program_id(1) * TN + tl.arange(0, TN)
    k = tl.arange(0, TK)
    acc = tl.zeros((TM, TN), dtype=tl.float32)
    for k0 in range(0, inputs, TK):
        x = tl.load(x_ptr + m[:, None] * x_row + (k0 + k)[None, :],
                    mask=(m[:, None] < rows) & ((k0 + k)[None, :] < inputs), other=0.0)
        w = tl.load(w_ptr + n[None, :] * w_row + (k0 + k)[:, None],
                    mask=(n[None, :] < outputs) & ((k0 + k)[:, None] < inputs), other=0.0)
        if WIDEN:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc += tl.dot(x, w)
    tl.store(y_ptr + m[:, None] * y_row + n[None, :], acc, mask=(m[:, None] < rows) & (n[None, :] < outputs))


def matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` ([rows, inputs] by [outputs, inputs]) in float32, every row the same bits at any rows."""
    x, weight = x.contiguous(), weight.contiguous()
    rows, inputs = x.shape
    outputs = weight.shape[0]
    y = torch.empty(rows, outputs, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(rows, TILE_M), triton.cdiv(outputs, TILE_N))
    _matmul_kernel[grid](x, weight, y, rows, outputs, inputs, x.stride(0), weight.stride(0), y.stride(0),
                         TM=TILE_M, TN=TILE_N, TK=TILE_K, WIDEN=INTERPRETED)
    return y


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, width, eps, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, CHUNK)
    squares = tl.zeros((CHUNK,), dtype=tl.float32)
    for start in range(0, width, CHUNK):
        x = tl.load(x_ptr + row * width + start + offsets, mask=start + offsets < width, other=0.0).to(tl.float32)
        squares += x * x
    scale = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / width + eps)
    for start in range(0, width, CHUNK):
        mask = start + offsets < width
        x = tl.load(x_ptr + row * width + start + offsets, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * width + start + offsets, x * scale * w, mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Each row of ``x`` ([rows, width]) times ``weight`` over its root mean square, in float32."""
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _rms_norm_kernel[(x.shape[0],)](x, weight.contiguous(), y, x.shape[1], eps, CHUNK=NORM_CHUNK)
    return y


@triton.jit
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, slots_ptr, lengths_ptr, heads, kv_heads, scale,
                             q_row, cache_slot, cache_head, o_row,
                             D: tl.constexpr, SPLIT: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // (heads // kv_heads)
    slot = tl.load(slots_ptr + row)
    length = tl.load(lengths_ptr + row)
    d = tl.arange(0, D)
    p = tl.arange(0, SPLIT)
    q = tl.load(q_ptr + row * q_row + head * D + d).to(tl.float32)
    base = slot * cache_slot + kv_head * cache_head
    # the loop's running maximum and total as the 0-d float32 tensors the loop makes of them (a compiled kernel
    # needs a loop-carried value's type fixed from the start)
    best = tl.max(tl.full((SPLIT,), float("-inf"), tl.float32), axis=0)
    total = tl.sum(tl.zeros((SPLIT,), dtype=tl.float32), axis=0)
    acc = tl.zeros((D,), dtype=tl.float32)
    for start in range(0, length, SPLIT):
        valid = start + p < length
        keys = tl.load(k_ptr + base + (start + p)[:, None] * D + d[None, :], mask=valid[:, None], other=0.0)
        scores = tl.sum(keys.to(tl.float32) * q[None, :], axis=1) * scale
        scores = tl.where(valid, scores, -float("inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=0))
        weights = tl.exp(scores - new_best)
        correction = tl.exp(best - new_best)
        values = tl.load(v_ptr + base + (start + p)[:, None] * D + d[None, :], mask=valid[:, None], other=0.0)
        acc = acc * correction + tl.sum(weights[:, None] * values.to(tl.float32), axis=0)
        total = total * correction + tl.sum(weights, axis=0)
        best = new_best
    tl.store(o_ptr + row * o_row + head * D + d, acc / total)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                     lengths: torch.Tensor) -> torch.Tensor:
    """One query a row (``q``: [rows, heads, D]) over its own slot's first ``lengths[row]`` positions of the cache
    (``keys``/``values``: [slots, KV heads, positions, D]; grouped heads share a KV head): [rows, heads, D] float32."""
    rows, heads, dim = q.shape
    kv_heads = keys.shape[1]
    if heads % kv_heads or dim & (dim - 1):
        raise ValueError(f"{heads} heads over {kv_heads} KV heads of dimension {dim}: heads must group evenly and "
                         "the dimension be a power of two")
    q, keys, values = q.contiguous(), keys.contiguous(), values.contiguous()
    out = torch.empty(rows, heads, dim, dtype=torch.float32, device=q.device)
    _decode_attention_kernel[(rows, heads)](
        q, keys, values, out, slots.to(torch.int64).contiguous(), lengths.to(torch.int64).contiguous(), heads,
        kv_heads, dim ** -0.5, q.stride(0), keys.stride(0), keys.stride(1), out.stride(0), D=dim, SPLIT=ATTENTION_SPLIT)
    return out
