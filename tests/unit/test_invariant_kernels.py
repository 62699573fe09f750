"""The batch-invariant kernels (executor/invariant_kernels.py) under Triton's interpreter on the CPU: their
arithmetic against PyTorch's, and every row the same bits alone and beside any number of other rows."""

from __future__ import annotations

import pytest
import torch
from helpers.requirements import require_module

kernels = require_module("proctor.executor.invariant_kernels")  # before anything else imports triton

WIDTHS = (1, 2, 3, 15, 16, 17, 40)  # short of a tile, a whole tile, past one, several


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_matches_torch_and_each_row_is_its_own_at_every_width(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(100, 200, generator=generator).to(dtype)  # neither side a multiple of a tile
    x = torch.randn(max(WIDTHS), 200, generator=generator).to(dtype)
    full = kernels.matmul(x, weight)
    reference = x.float() @ weight.float().T
    assert full.dtype == torch.float32
    assert torch.allclose(full, reference, atol=1e-4, rtol=1e-4)
    for width in WIDTHS:
        assert torch.equal(kernels.matmul(x[:width], weight), full[:width]), width
    alone = torch.cat([kernels.matmul(x[row:row + 1], weight) for row in range(x.shape[0])])
    assert torch.equal(alone, full)
    shuffled = torch.randperm(x.shape[0], generator=generator)
    assert torch.equal(kernels.matmul(x[shuffled], weight), full[shuffled])  # nor on its place in the batch


def test_rms_norm_matches_torch_and_is_per_row() -> None:
    generator = torch.Generator().manual_seed(1)
    width = 600  # more than two chunks, not a multiple of one
    x = torch.randn(max(WIDTHS), width, generator=generator) * 3
    weight = torch.randn(width, generator=generator)
    full = kernels.rms_norm(x, weight, 1e-6)
    reference = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    assert torch.allclose(full, reference, atol=1e-5, rtol=1e-5)
    for width_rows in WIDTHS:
        assert torch.equal(kernels.rms_norm(x[:width_rows], weight, 1e-6), full[:width_rows])


def _attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: list[int],
                         lengths: list[int]) -> torch.Tensor:
    heads, kv_heads = q.shape[1], keys.shape[1]
    rows = []
    for row, (slot, length) in enumerate(zip(slots, lengths, strict=True)):
        k = keys[slot, :, :length].repeat_interleave(heads // kv_heads, dim=0)  # [heads, length, D]
        v = values[slot, :, :length].repeat_interleave(heads // kv_heads, dim=0)
        scores = torch.einsum("hd,hld->hl", q[row], k) * q.shape[-1] ** -0.5
        rows.append(torch.einsum("hl,hld->hd", scores.softmax(-1), v))
    return torch.stack(rows)


def test_decode_attention_matches_torch_and_ignores_the_other_rows() -> None:
    generator = torch.Generator().manual_seed(2)
    slots_held, heads, kv_heads, dim, positions = 6, 4, 2, 16, 300
    keys = torch.randn(slots_held, kv_heads, positions, dim, generator=generator)
    values = torch.randn(slots_held, kv_heads, positions, dim, generator=generator)
    q = torch.randn(5, heads, dim, generator=generator)
    slots, lengths = [4, 0, 2, 5, 1], [1, 64, 65, 300, 130]  # one position, a split, just past one, many
    out = kernels.decode_attention(q, keys, values, torch.tensor(slots), torch.tensor(lengths))
    assert torch.allclose(out, _attention_reference(q, keys, values, slots, lengths), atol=1e-5, rtol=1e-5)
    for row in range(len(slots)):  # alone, the same bits
        alone = kernels.decode_attention(q[row:row + 1], keys, values, torch.tensor(slots[row:row + 1]),
                                         torch.tensor(lengths[row:row + 1]))
        assert torch.equal(alone[0], out[row]), row
    longer = [length + 100 if row else length for row, length in enumerate(lengths)]  # the others grew
    keys_more = keys.clone()
    keys_more[[0, 2, 5, 1], :, 200:] += 1  # and their later positions changed: row 0's slot 4 is untouched
    beside = kernels.decode_attention(q, keys_more, values, torch.tensor(slots),
                                      torch.tensor([min(length, positions) for length in longer]))
    assert torch.equal(beside[0], out[0])


def test_grouped_heads_must_divide_evenly() -> None:
    q = torch.zeros(1, 3, 16)
    cache = torch.zeros(1, 2, 4, 16)
    with pytest.raises(ValueError, match="group evenly"):
        kernels.decode_attention(q, cache, cache, torch.tensor([0]), torch.tensor([1]))
