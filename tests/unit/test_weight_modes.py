"""The weight modes of the slot forward (executor/weights.py) on the tiny model.

What each mode must keep: a row's logits the same bits alone or in a batch and at any thread count
(the engine's determinism, and what lets the thread tuner run), logits close to the dense
reference, and clear refusals where a mode cannot run.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from helpers.slots import feed_prompt, feed_prompts, feed_step

from proctor.config import WEIGHT_MODES
from proctor.executor.slot_forward import SlotForward
from proctor.executor.slot_weights import release_dense, slot_weights
from proctor.executor.smoothing import calibration_ids
from proctor.executor.weights import fbgemm_available, make_linear, mode_problem
from proctor.models.errors import ModelError
from proctor.models.placement import resolve_weights

PROMPTS = ["The capital of France is", "Hi", "你好，世界。今天天气很好。",
           "Once upon a time, in a small village by the sea, there lived an old fisherman", "1, 2, 3, 4,"]
QUANTIZED = [m for m in WEIGHT_MODES if m not in ("dense", "gguf")]  # gguf: a .gguf file (test_gguf_models.py)
needs_fbgemm = pytest.mark.skipif(not fbgemm_available(), reason="fbgemm needs an x86 CPU with AVX2")


def logits_alone_and_together(model, tokenizer, mode: str,  # type: ignore[no-untyped-def]
                               greedy: bool = True) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each prompt's last logits, then two steps (its greedy token, or with ``greedy`` False token 11, whatever the
    mode chose: modes then compare on the same inputs; then token 7), alone and in a batch of all the prompts."""
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]

    def follow(logits: torch.Tensor) -> int:
        return int(logits.argmax()) if greedy else 11

    with torch.inference_mode():
        alone = []
        for ids in prompts:
            solo = SlotForward(model, 1, torch.device("cpu"), mode, calibration_ids(tokenizer))
            first = feed_prompt(solo, 0, ids)
            alone.append(torch.cat([first, feed_step(solo, [follow(first)]), feed_step(solo, [7])]))
        batch = SlotForward(model, len(prompts), torch.device("cpu"), mode, calibration_ids(tokenizer))
        firsts = feed_prompts(batch, prompts)
        second = feed_step(batch, [follow(row) for row in firsts])
        third = feed_step(batch, [7] * len(prompts))
    together = [torch.stack([firsts[i], second[i], third[i]]) for i in range(len(prompts))]
    return alone, together


@needs_fbgemm
@pytest.mark.parametrize("mode", QUANTIZED)
def test_a_rows_logits_are_the_same_bits_alone_and_in_a_batch(tiny_model, tokenizer, mode: str) -> None:  # type: ignore[no-untyped-def]
    alone, together = logits_alone_and_together(tiny_model, tokenizer, mode)
    for index, (a, t) in enumerate(zip(alone, together, strict=True)):
        assert torch.equal(a, t), f"{mode}: row {index} changed in a batch (max gap {(a - t).abs().max():.3g})"


@needs_fbgemm
@pytest.mark.parametrize("mode", QUANTIZED)
def test_a_rows_logits_are_the_same_bits_at_any_thread_count(tiny_model, tokenizer, mode: str) -> None:  # type: ignore[no-untyped-def]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = logits_alone_and_together(tiny_model, tokenizer, mode)[1]
        torch.set_num_threads(max(2, threads))
        more = logits_alone_and_together(tiny_model, tokenizer, mode)[1]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, more, strict=True))
    runner = SlotForward(tiny_model, 1, torch.device("cpu"), mode, calibration_ids(tokenizer))
    assert runner.capabilities.thread_invariant


@needs_fbgemm
@pytest.mark.parametrize(("mode", "tolerance"), [("fp16", 2e-3), ("q8", 0.1)])
def test_quantized_logits_stay_close_to_dense(tiny_model, tokenizer, mode: str, tolerance: float) -> None:  # type: ignore[no-untyped-def]
    dense = logits_alone_and_together(tiny_model, tokenizer, "dense", greedy=False)[1]
    quantized = logits_alone_and_together(tiny_model, tokenizer, mode, greedy=False)[1]
    for d, q in zip(dense, quantized, strict=True):
        relative = float((q - d).norm() / d.norm())
        assert relative < tolerance, f"{mode}: relative error {relative:.2e}"
        assert not torch.equal(q, d), f"{mode} gave dense's exact bits: it did not run"


@needs_fbgemm
def test_q4_logits_stay_close_to_dense_on_its_own_blocks(tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """q4 against dense running the very weights its blocks hold: what is left is the kernel's int8
    rounding of activations. (Against the tiny model's own random fp32 weights, 4-bit rounding alone
    moves these logits by 25-90 %; the real model's weights are its GGUF's blocks, where q4 is exact:
    tests/integration/test_q4_weights_real.py.)"""
    from proctor.executor.weights import BlockLinear

    on_blocks = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for layer in on_blocks.model.layers:
            for linear in (*(getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")),
                           layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                rows = torch.arange(linear.weight.shape[0])
                linear.weight.copy_(BlockLinear(linear.weight, "q4_1").dequantized_rows(rows))
        embedding = on_blocks.model.embed_tokens.weight
        embedding.copy_(BlockLinear(embedding, "q8_0").dequantized_rows(torch.arange(embedding.shape[0])))
    dense = logits_alone_and_together(on_blocks, tokenizer, "dense", greedy=False)[1]
    q4 = logits_alone_and_together(on_blocks, tokenizer, "q4", greedy=False)[1]
    assert slot_weights(on_blocks, "q4").embed.numel() == 0  # its embedding is the head's blocks: not kept twice
    for d, q in zip(dense, q4, strict=True):
        relative = float((q - d).norm() / d.norm())
        assert relative < 0.1, f"q4: relative error {relative:.2e}"
        assert not torch.equal(q, d), "q4 gave dense's exact bits: it did not run"


@needs_fbgemm
def test_int8_rows_use_their_own_scale() -> None:
    """A row of tiny values next to a row of large ones keeps its precision (per-row, not per-tensor)."""
    torch.manual_seed(0)
    weight = torch.randn(48, 32)
    linear = make_linear(weight, "q8")
    small, large = torch.randn(1, 32) * 1e-3, torch.randn(1, 32) * 1e3
    together = linear(torch.cat([small, large]))
    reference = small @ weight.T
    assert torch.equal(together[:1], linear(small))
    assert float((together[:1] - reference).norm() / reference.norm()) < 0.03


def test_weight_bytes_shrink_by_mode(tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    dense = slot_weights(tiny_model, "dense").nbytes
    assert dense > 0
    if fbgemm_available():
        assert slot_weights(tiny_model, "fp16").nbytes == dense // 2
        assert slot_weights(tiny_model, "q8", calibration_ids(tokenizer)).nbytes < dense // 3
        assert slot_weights(tiny_model, "q4").nbytes < dense // 3  # the LM head (8.5 bits) dominates the tiny model


@needs_fbgemm
def test_block_products_match_their_dequantized_weights() -> None:
    """q4's kernel products: within int8 activation rounding of x @ dequantized W.T, each row's scale its
    own (per row and per block of 32), the same bits alone and in a batch; the lookup of a row is exact."""
    from proctor.executor.weights import BlockLinear

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 96, generator=generator)  # 5 groups of 8 rows, 3 blocks of 32
    for block_format in ("q4_1", "q8_0"):
        linear = BlockLinear(weight, block_format)
        dequantized = linear.dequantized_rows(torch.arange(40))
        assert float((dequantized - weight).abs().max()) < (0.25 if block_format == "q4_1" else 0.02)
        assert torch.equal(linear.dequantized_rows(torch.tensor([3])), dequantized[3:4])
        assert torch.equal(linear.rows(torch.tensor([3, 39, 0])), dequantized[[3, 39, 0]])  # the kernel's lookup
        small, large = torch.randn(1, 96, generator=generator) * 1e-3, torch.randn(5, 96, generator=generator) * 1e3
        together = linear(torch.cat([small, large]))
        assert torch.equal(together[:1], linear(small))
        assert torch.equal(together[1:], torch.cat([linear(row[None]) for row in large]))
        reference = small @ dequantized.T
        assert float((together[:1] - reference).norm() / reference.norm()) < 0.02, block_format


@needs_fbgemm
def test_block_weights_refuse_sizes_the_blocks_cannot_hold() -> None:
    from proctor.executor.weights import BlockLinear

    with pytest.raises(ValueError, match="multiples of 32"):
        BlockLinear(torch.randn(8, 40), "q4_1")
    linear = BlockLinear(torch.randn(8, 64), "q4_1")
    with pytest.raises(RuntimeError, match="do not match 96 inputs"):
        torch.ops.proctor.q4_linear(torch.randn(1, 96), linear.blocks)


@needs_fbgemm
def test_q8_needs_its_calibration_text(tiny_model) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="calibration"):
        slot_weights(copy.deepcopy(tiny_model), "q8")


@needs_fbgemm
def test_smoothing_leaves_the_dense_product_unchanged(tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """The per-channel scales folded into norms, v and up rows cancel exactly in real arithmetic: run
    the smoothed weights densely and the logits match the dense forward to float rounding."""
    from proctor.executor.slot_weights import _build_smoothed
    from proctor.executor.smoothing import input_peaks

    ids = tokenizer(PROMPTS[3])["input_ids"]
    smoothed = _build_smoothed(tiny_model, "dense", input_peaks(tiny_model, calibration_ids(tokenizer)))
    plain = SlotForward(tiny_model, 1, torch.device("cpu"))
    smoothed = dataclasses.replace(smoothed, embed=plain.weights.embed)  # the fp32 table, not q8's fp16 one
    folded = SlotForward(tiny_model, 1, torch.device("cpu"))
    folded.weights, folded._layers, folded._lm_head = smoothed, smoothed.layers, smoothed.lm_head
    folded._final_norm = smoothed.final_norm
    with torch.inference_mode():
        expected, got = feed_prompt(plain, 0, ids), feed_prompt(folded, 0, ids)
    assert not torch.equal(expected, got), "no scale was folded"
    assert torch.allclose(expected, got, atol=1e-4, rtol=1e-4)


def test_modes_that_cannot_run_are_refused_clearly() -> None:
    cpu = torch.device("cpu")
    assert "unknown weights mode 'q2'" in str(mode_problem("q2", cpu, torch.float32))
    assert "--dtype float32" in str(mode_problem("q8", cpu, torch.bfloat16))
    assert "CPU mode" in str(mode_problem("fp16", torch.device("cuda"), torch.bfloat16))
    assert mode_problem("dense", torch.device("cuda"), torch.bfloat16) is None
    with pytest.raises(ModelError, match="--dtype float32"):
        resolve_weights("q8", cpu, torch.bfloat16)
    assert resolve_weights("auto", cpu, torch.bfloat16) == "dense"
    assert resolve_weights("DENSE", cpu, torch.float32) == "dense"
    if fbgemm_available():
        assert resolve_weights("auto", cpu, torch.float32) in QUANTIZED


def test_released_dense_weights_keep_built_modes_and_refuse_new_ones(tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    model = copy.deepcopy(tiny_model)
    ids = tokenizer(PROMPTS[0])["input_ids"]
    with torch.inference_mode():
        before = feed_prompt(SlotForward(model, 1, torch.device("cpu"), "dense"), 0, ids)
        freed = release_dense(model)
        after = feed_prompt(SlotForward(model, 1, torch.device("cpu"), "dense"), 0, ids)
    assert freed > 0
    assert model.model.layers[0].mlp.down_proj.weight.numel() == 0
    assert torch.equal(before, after)
    assert release_dense(model) == 0
    with pytest.raises(RuntimeError, match="released"):
        slot_weights(model, "fp16")
