"""The q8 and q4 decode kernels (executor/fused_decode.py, kernels/) on the tiny model.

It replaces ~60 PyTorch operations per layer, so it must compute what they compute: the same logits
(up to float rounding) and the same keys and values in the cache, over prefixes longer than a block,
for rows of different lengths; and bad arguments must raise, not crash the process. Batch and thread
invariance are checked for every mode in test_weight_modes.py (q8 decode runs this kernel).
"""

from __future__ import annotations

import pytest
import torch
from helpers.requirements import missing

from proctor.decoding import logits_ops
from proctor.executor import fused_decode
from proctor.executor.protocol import Feed
from proctor.executor.slot_forward import SlotForward
from proctor.executor.smoothing import calibration_ids
from proctor.executor.weights import fbgemm_available

PROMPT_LENGTHS = (3, 70, 130)  # one short row, rows past one and two 64-position attention blocks


@pytest.fixture(scope="module")
def kernel_ready() -> None:
    if not fbgemm_available():
        missing("fbgemm needs an x86 CPU with AVX2")
    problem = fused_decode.load_problem()
    if problem is not None:
        missing(f"the q8 decode kernel: {problem}")


def prefilled(model, tokenizer, lengths: tuple[int, ...], mode: str = "q8") -> SlotForward:  # type: ignore[no-untyped-def]
    slots = SlotForward(model, len(lengths), torch.device("cpu"), mode, calibration_ids(tokenizer))
    generator = torch.Generator().manual_seed(3)
    for slot, length in enumerate(lengths):
        slots.forward([Feed(slot, torch.randint(10, 5000, (length,), generator=generator).tolist(), 1)])
    return slots


def snapshot(slots: SlotForward) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor]]:
    return list(slots.lengths), [k.clone() for k in slots._keys], [v.clone() for v in slots._values]


def restore(slots: SlotForward, state: tuple[list[int], list[torch.Tensor], list[torch.Tensor]]) -> None:
    slots.lengths = list(state[0])
    slots._keys, slots._values = [k.clone() for k in state[1]], [v.clone() for v in state[2]]


def test_the_kernel_builds_and_loads(kernel_ready: None) -> None:
    assert fused_decode.load_problem() is None
    assert hasattr(torch.ops.proctor, "decode_layer")
    assert hasattr(torch.ops.proctor, "decode_layer_q4")


@pytest.mark.parametrize("mode", ["q8", "q4"])
def test_the_kernel_computes_what_the_operations_compute(kernel_ready: None, tiny_model, tokenizer, mode: str) -> None:  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        slots = prefilled(tiny_model, tokenizer, PROMPT_LENGTHS, mode)
        state = snapshot(slots)
        steps = [[Feed(slot, [token], 1) for slot, token in enumerate(tokens)]
                 for tokens in ([11, 22, 33], [44, 55, 66])]
        reference = [slots.forward_ops(feeds) for feeds in steps]
        reference_cache = snapshot(slots)
        restore(slots, state)
        fused = [slots.forward(feeds) for feeds in steps]
    for step, (r, f) in enumerate(zip(reference, fused, strict=True)):
        relative = float((r - f).norm() / r.norm())
        assert relative < 1e-4, f"step {step}: logits differ by {relative:.2e}"
        assert torch.equal(r.argmax(-1), f.argmax(-1))
    assert slots.lengths == reference_cache[0] == [n + 2 for n in PROMPT_LENGTHS]
    for layer, (rk, fk) in enumerate(zip(reference_cache[1], slots._keys, strict=True)):
        for row, length in enumerate(PROMPT_LENGTHS):
            written = slice(length, length + 2)
            assert torch.allclose(rk[row, :, written], fk[row, :, written], rtol=1e-4, atol=1e-5), (layer, row)
            assert torch.equal(rk[row, :, :length], fk[row, :, :length])  # the prefix is left alone


def test_bad_arguments_raise_instead_of_crashing(kernel_ready: None, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        slots = prefilled(tiny_model, tokenizer, (5,))
        layer = slots._layers[0]
        h = torch.zeros(1, tiny_model.config.hidden_size)
        cos, sin = (table[:, 0] for table in slots.rotary.by_key[None])
        op = fused_decode.decode_layer()
        arguments = [h, layer.in_norm, layer.qkv.packed, layer.o.packed, layer.post_norm, layer.gate_up.packed,
                     layer.down.packed, slots._keys[0], slots._values[0], [5], cos, sin, slots.heads, slots.kv_heads,
                     slots.eps, layer.qkv.reduce_range]
        beyond = list(arguments)
        beyond[9] = [slots._keys[0].shape[2]]  # past the cache
        with pytest.raises(RuntimeError, match="position out of range"):
            op(*beyond)
        wrong_type = list(arguments)
        wrong_type[0] = h.double()
        with pytest.raises(RuntimeError, match="float32"):
            op(*wrong_type)
        too_many_rows = list(arguments)
        too_many_rows[9] = [5, 5]
        with pytest.raises(RuntimeError, match="batch"):
            op(*too_many_rows)


def test_without_the_kernel_auto_falls_back_to_fp16_and_q8_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from proctor.models.errors import ModelError
    from proctor.models.placement import resolve_weights

    if not fbgemm_available():
        missing("fbgemm needs an x86 CPU with AVX2")
    monkeypatch.setattr(fused_decode, "load_problem", lambda: "no C++ compiler")
    cpu = torch.device("cpu")
    assert resolve_weights("auto", cpu, torch.float32) == "fp16"
    with pytest.raises(ModelError, match=r"no C\+\+ compiler.*--weights fp16"):
        resolve_weights("q8", cpu, torch.float32)


def test_the_kernels_mask_fill_gives_masked_fills_bits(kernel_ready: None) -> None:
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(16, 49152, generator=generator)
    logits[0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    banned = torch.rand(16, 49152, generator=generator) > 0.7
    banned[0, :2] = False  # NaN and +inf stay where allowed
    expected = logits.clone().masked_fill_(banned, float("-inf"))
    fused_decode.decode_layer()  # loads the library
    got = logits.clone()
    assert logits_ops.fill_banned(got, banned), "the pipeline would not use the kernel"
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    with pytest.raises(RuntimeError, match="banned must be"):
        torch.ops.proctor.fill_banned(logits.clone(), banned[:, :100].contiguous())


def test_the_q4_kernel_refuses_blocks_that_do_not_fit(kernel_ready: None, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        slots = prefilled(tiny_model, tokenizer, (5,), "q4")
        layer = slots._layers[0]
        h = torch.zeros(1, tiny_model.config.hidden_size)
        cos, sin = (table[:, 0] for table in slots.rotary.by_key[None])
        op = fused_decode.decode_layer("q4")
        arguments = [h, layer.in_norm, layer.qkv.blocks, layer.o.blocks, layer.post_norm, layer.gate_up.blocks,
                     layer.down.blocks, slots._keys[0], slots._values[0], [5], cos, sin, slots.heads, slots.kv_heads,
                     slots.eps]
        swapped = list(arguments)
        swapped[2] = layer.o.blocks  # the right input size, the wrong outputs
        with pytest.raises(RuntimeError, match="qkv width"):
            op(*swapped)
        wrong_inputs = list(arguments)
        wrong_inputs[6] = layer.o.blocks  # down's inputs are the MLP's, not the hidden size
        with pytest.raises(RuntimeError, match="do not match"):
            op(*wrong_inputs)
        op(*arguments)  # and the right ones run


def test_the_kernels_bitmask_unpacking_gives_the_operations_values(kernel_ready: None) -> None:
    from proctor.constraints.backend import bitmask_to_bool

    generator = torch.Generator().manual_seed(6)
    vocab = 49152 + 13  # a last word only partly used
    bitmask = torch.randint(-2**31, 2**31 - 1, (5, (vocab + 31) // 32), generator=generator, dtype=torch.int32)
    bitmask[1] = -1  # everything allowed
    bitmask[2] = 0  # nothing allowed
    fused_decode.decode_layer()  # loads the library
    unpacked = logits_ops.unpack_banned(bitmask, vocab)
    assert unpacked is not None
    banned, allowed = unpacked
    expected = ~bitmask_to_bool(bitmask, vocab)
    assert torch.equal(banned, expected)
    assert allowed.tolist() == (~expected).sum(dim=-1).tolist()
    assert allowed[1] == vocab and allowed[2] == 0


def test_the_kernels_argmax_gives_torchs_indices(kernel_ready: None) -> None:
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(6, 49152 + 3, generator=generator)
    logits[1, 100] = logits[1, 7] = 50.0  # a tie: the first index wins
    logits[2] = float("-inf")  # nothing allowed
    logits[3, 49152 + 2] = 99.0  # the maximum in the tail past the last full vector
    logits[4, 20] = float("nan")  # torch counts a NaN as the largest
    logits[5, :] = 0.0
    fused_decode.decode_layer()  # loads the library
    assert logits_ops.row_argmax(logits) == logits.argmax(dim=-1).tolist()


def test_the_kernels_logsumexp_and_topk_match_torchs(kernel_ready: None) -> None:
    generator = torch.Generator().manual_seed(8)
    logits = torch.randn(5, 49152 + 5, generator=generator) * 4
    logits[1, ::3] = float("-inf")  # a masked row
    logits[2] = float("-inf")  # nothing allowed
    logits[2, 9] = 1.5
    logits[3, -1] = 40.0  # the largest in the tail
    fused_decode.decode_layer()  # loads the library
    expected = torch.logsumexp(logits, dim=-1)
    got = logits_ops.row_logsumexp(logits)
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-5)
    assert float(got[2]) == 1.5
    assert float(logits_ops.row_logsumexp(torch.full((1, 40), float("-inf")))[0]) == float("-inf")
    for k in (1, 5, 20):
        values, indices = logits_ops.row_topk(logits, k)
        reference_values, reference_indices = logits.topk(k, dim=-1)
        assert torch.equal(values[[0, 1, 3, 4]], reference_values[[0, 1, 3, 4]])
        assert torch.equal(indices[[0, 1, 3, 4]], reference_indices[[0, 1, 3, 4]])
        assert int(indices[2, 0]) == 9 and float(values[2, 0]) == 1.5  # then -inf entries
    ties = torch.zeros(1, 100)
    ties[0, [40, 7, 90]] = 2.0
    assert logits_ops.row_topk(ties, 3)[1].tolist() == [[7, 40, 90]]  # equal values: the lower index first


def test_the_kernels_masked_pick_gives_the_masked_copys_argmax_and_logsumexp_bits(kernel_ready: None) -> None:
    from proctor.constraints.backend import bitmask_to_bool

    generator = torch.Generator().manual_seed(9)
    vocab = 49152 + 13  # a last word only partly used
    logits = torch.randn(6, vocab, generator=generator) * 4
    bitmask = torch.randint(-2**31, 2**31 - 1, (6, (vocab + 31) // 32), generator=generator, dtype=torch.int32)
    bitmask[1] = -1  # everything allowed
    bitmask[2] = 0  # nothing allowed
    bitmask[3] = 0
    bitmask[3, 1000 // 32] = 1 << (1000 % 32)  # one token allowed
    logits[4, 5] = float("nan")  # a NaN counts as the largest (banned or not)
    bitmask[5, -1] = -1
    logits[5, vocab - 1] = 99.0  # the maximum in the tail, allowed
    fused_decode.decode_layer()  # loads the library
    untouched = logits.clone()
    picked = logits_ops.masked_pick(logits, bitmask)
    assert picked is not None
    chosen, lse, allowed = picked
    torch.testing.assert_close(logits, untouched, rtol=0, atol=0, equal_nan=True)  # the logits are not edited
    masked = logits.masked_fill(~bitmask_to_bool(bitmask, vocab), float("-inf"))
    assert chosen == logits_ops.row_argmax(masked)
    expected_lse = logits_ops.row_logsumexp(masked)
    assert torch.equal(lse[[0, 1, 3, 5]], expected_lse[[0, 1, 3, 5]])  # the same bits
    assert float(lse[2]) == float("-inf") and chosen[3] == 1000 and chosen[5] == vocab - 1
    assert allowed == bitmask_to_bool(bitmask, vocab).sum(dim=-1).tolist()
    assert allowed[1] == vocab and allowed[2] == 0 and allowed[3] == 1
