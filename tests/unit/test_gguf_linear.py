"""The gguf weights mode's products on every block type it serves (kernels/ggml_linear.cpp).

For each type the weight is random bytes (every code and bit pattern; scales set to sane float16 values)
or gguf's own quantizer, and the reference is the gguf package's dequantized weight (llama.cpp's own
Python reference) times the activations rounded as llama.cpp rounds them for that type (Q8_0, Q8_1,
Q8_K, float16, bfloat16), in float64. Rows must be ggml's dequantized values exactly, and a row's
result the same bits alone, in a batch of 16, and on one thread or two.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.ggml_blocks import random_blocks
from helpers.requirements import hardware_lacks, missing, require_module

from proctor.executor import fused_decode
from proctor.executor.gguf_linear import BLOCK_TYPES, GgufLinear, GgufStack

gguf = require_module("gguf")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

OUT, INPUTS = 24, 512
TYPES = sorted(BLOCK_TYPES)


@pytest.fixture(scope="module", autouse=True)
def kernel_ready() -> None:
    problem = fused_decode.load_problem()
    if problem is not None:
        missing(f"the decode kernels: {problem}")


def rounded_activations(x: np.ndarray, ggml_type: int) -> np.ndarray:
    """x as llama.cpp's quantize_row_* for the type's vec_dot_type leaves it (dequantized, float64)."""
    name = GGMLQuantizationType(ggml_type).name
    x = x.astype(np.float32)
    if name == "F32":
        return x.astype(np.float64)
    if name == "F16":
        return x.astype(np.float16).astype(np.float64)
    if name == "BF16":
        return torch.from_numpy(x).bfloat16().double().numpy()
    if name.endswith("_K"):  # Q8_K: 256 a block, scale −127/max by the signed largest value
        blocks = x.reshape(x.shape[0], -1, 256)
        at = np.abs(blocks).argmax(axis=-1)
        signed = np.take_along_axis(blocks, at[..., None], axis=-1)
        iscale = np.where(signed != 0, np.float32(-127.0) / np.where(signed != 0, signed, 1), 0).astype(np.float32)
        codes = np.minimum(127, np.rint(iscale * blocks))
        d = np.where(iscale != 0, np.float32(1.0) / np.where(iscale != 0, iscale, 1), 0).astype(np.float32)
        return (d.astype(np.float64) * codes).reshape(x.shape)
    blocks = x.reshape(x.shape[0], -1, 32)  # Q8_0 / Q8_1: 32 a block, float16 scale
    d = (np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inverse = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    codes = np.rint(blocks * inverse)
    return (d.astype(np.float16).astype(np.float64) * codes).reshape(x.shape)


def linear(ggml_type: int, raw: np.ndarray) -> GgufLinear:
    return GgufLinear(torch.from_numpy(np.ascontiguousarray(raw)), ggml_type, INPUTS)


@pytest.mark.parametrize("ggml_type", TYPES, ids=[BLOCK_TYPES[t][0] for t in TYPES])
def test_rows_are_ggmls_dequantized_values(ggml_type: int) -> None:
    raw = random_blocks(ggml_type, OUT, INPUTS)
    reference = dequantize(raw, GGMLQuantizationType(ggml_type)).reshape(OUT, INPUTS)
    rows = linear(ggml_type, raw).rows(torch.arange(OUT))
    assert torch.equal(rows, torch.from_numpy(reference.astype(np.float32)))


@pytest.mark.parametrize("ggml_type", TYPES, ids=[BLOCK_TYPES[t][0] for t in TYPES])
def test_the_product_is_the_dequantized_weight_times_the_rounded_activations(ggml_type: int) -> None:
    raw = random_blocks(ggml_type, OUT, INPUTS)
    weight = dequantize(raw, GGMLQuantizationType(ggml_type)).reshape(OUT, INPUTS).astype(np.float64)
    x = torch.randn(5, INPUTS, generator=torch.Generator().manual_seed(ggml_type))
    x[1] *= 40.0  # rows of very different magnitudes
    x[2, :256] = 0.0  # an all-zero block
    rounded = rounded_activations(x.numpy(), ggml_type)
    reference = rounded @ weight.T
    magnitude = np.abs(rounded) @ np.abs(weight).T
    got = linear(ggml_type, raw)(x).double().numpy()
    # Float32 sums; Q4_1/Q5_1 also keep the activation block's d·Σcodes as float16 (llama.cpp's Q8_1 s).
    tolerance = 2e-3 if BLOCK_TYPES[ggml_type][0] in ("Q4_1", "Q5_1") else 2e-5
    assert np.all(np.abs(got - reference) <= tolerance * magnitude + 1e-6)
    # and close to the unrounded activations (the rounding is the only approximation)
    exact = x.double().numpy() @ weight.T
    assert np.abs(got - exact).max() <= 0.02 * np.abs(exact).max()


@pytest.mark.parametrize("ggml_type", TYPES, ids=[BLOCK_TYPES[t][0] for t in TYPES])
def test_a_row_is_the_same_bits_alone_in_a_batch_and_on_any_thread_count(ggml_type: int) -> None:
    product = linear(ggml_type, random_blocks(ggml_type, OUT, INPUTS))
    x = torch.randn(16, INPUTS, generator=torch.Generator().manual_seed(7))
    batch = product(x)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [product(x[i:i + 1])[0] for i in range(16)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(batch[i], alone[i]) for i in range(16))
    assert torch.equal(product(x[3:9]), batch[3:9])
    for count in (2, 3, 4, 5):  # the K-quants' few-row loop (up to 4) and the groups' tiles, side by side
        assert torch.equal(product(x[:count]), batch[:count]), count


@pytest.mark.parametrize("ggml_type", TYPES, ids=[BLOCK_TYPES[t][0] for t in TYPES])
def test_a_row_is_the_same_bits_whichever_rows_are_beside_it(ggml_type: int) -> None:
    """The block types go eight weight rows at a time: rows 5..17 on their own (13 rows, a short last group,
    each in another lane), times 9 activation rows (more than a tile: the group's blocks made once into
    scratch) or 2 (the K-quants' few-row loop), must give the bits they give inside the whole matrix."""
    raw = random_blocks(ggml_type, OUT, INPUTS)
    for rows in (9, 2):
        x = torch.randn(rows, INPUTS, generator=torch.Generator().manual_seed(3))
        whole = linear(ggml_type, raw)(x)
        part = linear(ggml_type, np.ascontiguousarray(raw[5:18]))(x)
        assert torch.equal(part, whole[:, 5:18]), rows


def test_a_stack_of_types_is_its_parts_side_by_side() -> None:  # one call for the stack, one a part here
    parts = [linear(t, random_blocks(t, OUT, INPUTS)) for t in (14, 12, 8)]  # Q6_K, Q4_K, Q8_0: a Q4_K_M mix
    stack = GgufStack(parts)
    x = torch.randn(3, INPUTS)
    assert torch.equal(stack(x), torch.cat([part(x) for part in parts], dim=-1))
    assert stack.out_features == 3 * OUT and stack.types == [14, 12, 8]


def test_bad_blocks_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="no product for"):
        GgufLinear(torch.zeros(8, 84, dtype=torch.uint8), 10, 256)  # Q2_K
    with pytest.raises(ValueError, match="do not hold 512 inputs"):
        GgufLinear(torch.zeros(8, 100, dtype=torch.uint8), 12, 512)
    good = linear(12, random_blocks(12, OUT, INPUTS))
    with pytest.raises(RuntimeError, match="do not match"):
        torch.ops.proctor.ggml_linear(torch.randn(1, 256), [good.blocks], [12])


def test_the_vnni_loops_give_the_avx2_loops_bits() -> None:
    """Where the CPU has AVX-512 VNNI its loops run (ggml_dot.h, q4_dot.h); they must give the AVX2 loops'
    bits for every type, so a record replays the same on either machine."""
    loops = torch.ops.proctor.q4_loops("")
    if loops != "avx512-vnni":  # the AVX2 loops are the only ones to run: nothing to compare them with
        assert loops == "avx2"
        hardware_lacks("skipped: no VNNI here")
    products = [linear(t, random_blocks(t, OUT, INPUTS)) for t in TYPES]
    x = torch.randn(19, INPUTS, generator=torch.Generator().manual_seed(5))  # tiles of 8, 8 and 3
    weight = torch.randn(64, INPUTS)
    q4_1, q8_0 = torch.ops.proctor.quantize_q4_1(weight), torch.ops.proctor.quantize_q8_0(weight)

    def everything() -> list[torch.Tensor]:
        return [p(x) for p in products] + [p(x[:3]) for p in products] + [  # and the few-row loop
            torch.ops.proctor.q4_linear(x, q4_1), torch.ops.proctor.q8_0_linear(x, q8_0)]

    vnni = everything()
    try:
        assert torch.ops.proctor.q4_loops("avx2") == "avx2"
        avx2 = everything()
    finally:
        torch.ops.proctor.q4_loops("auto")
    for index, (a, b) in enumerate(zip(vnni, avx2, strict=True)):
        assert torch.equal(a, b), index
