"""The slot forward with the batch-invariant kernels' products (executor/triton_step.py), under Triton's interpreter on
the CPU: the same logits as the PyTorch step to float tolerance, and every row's logits the same bits alone, in
any batch, and with its prompt fed whole or in pieces."""

from __future__ import annotations

import pytest
import torch
from helpers.requirements import require_module

require_module("proctor.executor.invariant_kernels")  # before anything else imports triton

from proctor.executor.build import make_executor  # noqa: E402
from proctor.executor.plan import ExecutorKind, executor_plan  # noqa: E402
from proctor.executor.protocol import Feed  # noqa: E402
from proctor.executor.slot_forward import SlotForward  # noqa: E402
from proctor.executor.triton_step import TritonStep  # noqa: E402

CPU = torch.device("cpu")


def invariant_slots(model, slots: int) -> SlotForward:  # type: ignore[no-untyped-def]
    return SlotForward(model, slots, CPU, "dense", products="invariant")
PROMPT = [2, 45, 3000, 17, 802, 9, 61, 4410, 13]


def test_the_invariant_step_computes_the_pytorch_steps_logits(tiny_model) -> None:  # type: ignore[no-untyped-def]
    invariant, reference = invariant_slots(tiny_model, 2), SlotForward(tiny_model, 2, CPU, "dense")
    with torch.inference_mode():
        for runner in (invariant, reference):
            runner.forward([Feed(0, PROMPT, len(PROMPT))])
        mine = invariant.forward([Feed(0, [77], 1)])
        theirs = reference.forward([Feed(0, [77], 1)])
        prompt_mine = invariant.forward([Feed(1, PROMPT[:4], 4)])
        prompt_theirs = reference.forward([Feed(1, PROMPT[:4], 4)])
    assert torch.allclose(mine, theirs, atol=2e-4, rtol=1e-4)
    assert torch.allclose(prompt_mine, prompt_theirs, atol=2e-4, rtol=1e-4)
    assert mine.argmax().item() == theirs.argmax().item()


def test_each_rows_logits_are_its_own_bits_alone_in_a_batch_and_in_pieces(tiny_model) -> None:  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        alone = invariant_slots(tiny_model, 4)
        whole = alone.forward([Feed(0, PROMPT, len(PROMPT))])
        step = alone.forward([Feed(0, [77], 1)])
        crowded = invariant_slots(tiny_model, 4)
        crowded.forward([Feed(2, [5, 6, 7, 8, 9, 10], 0), Feed(3, [11], 1)])  # others already in the cache
        first = crowded.forward([Feed(3, [12, 13], 2), Feed(0, PROMPT[:5], 5), Feed(2, [14], 1)])
        rest = crowded.forward([Feed(0, PROMPT[5:], 4), Feed(3, [15, 16, 17], 3), Feed(1, [18, 19], 1)])
        beside = crowded.forward([Feed(2, [20], 1), Feed(0, [77], 1), Feed(1, [21], 1), Feed(3, [22], 1)])
    assert torch.equal(torch.cat([first[2:7], rest[:4]]), whole)  # the prompt in two pieces among other rows
    assert torch.equal(beside[1:2], step)  # the decode row among three others


def test_families_the_kernels_do_not_compute_are_refused(tiny_model) -> None:  # type: ignore[no-untyped-def]
    import copy

    changed = copy.deepcopy(tiny_model)
    changed.config.attention_bias = True  # the family is read from the config (executor/families.describe)
    with pytest.raises(ValueError, match="Llama's arithmetic exactly"):
        invariant_slots(changed, 2)


def test_the_step_multiplies_the_slot_weights_own_plain_matrices_without_a_copy(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """Where the slot weights keep a matrix plain (bfloat16 here, as on CUDA), the invariant step multiplies that
    very tensor; where they are packed for oneDNN (float32 on the CPU) it takes the model's."""
    import copy

    from proctor.executor.weights import plain_weight

    half = copy.deepcopy(tiny_model).to(torch.bfloat16)
    runner = invariant_slots(half, 2)
    step = runner.step
    assert isinstance(step, TritonStep)
    first = runner._layers[0]
    assert plain_weight(first.qkv) is not None
    assert step._matrices[0].qkv.data_ptr() == plain_weight(first.qkv).data_ptr()
    assert step._matrices[0].down.data_ptr() == plain_weight(first.down).data_ptr()
    packed = invariant_slots(tiny_model, 2)
    assert isinstance(packed.step, TritonStep) and plain_weight(packed._layers[0].qkv) is None
    assert torch.equal(packed.step._matrices[0].down, tiny_model.model.layers[0].mlp.down_proj.weight)
    with torch.inference_mode():
        logits = runner.forward([Feed(0, PROMPT[:3], 1)])
    assert logits.shape == (1, tiny_model.config.vocab_size) and torch.isfinite(logits).all()


def test_the_engine_serves_plain_and_beam_requests_on_the_plan_cuda_makes_for_on(make_engine, tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    """The engine on the plan ``--batch-invariant on`` makes on CUDA (built here on the CPU, where the default step is
    invariant already): the invariant step, and plain and beam requests in one batch give the default step's tokens
    (the tiny model's margins are far above the two steps' float differences)."""
    from helpers.engine import serve_plain_and_beams

    expected = serve_plain_and_beams(make_engine())
    plan = executor_plan(tiny_loaded.model, torch.device("cuda"), "dense", batch_invariant="on").on(CPU)
    assert plan.kind is ExecutorKind.INVARIANT and plan.rows_own_bits
    engine = make_engine(plan=plan)
    assert serve_plain_and_beams(engine) == expected
    runner = engine._batch._executor
    assert isinstance(runner, SlotForward) and isinstance(runner.step, TritonStep)
    assert (runner.products, runner.replay) == ("invariant", "eager") and runner.capabilities == plan.capabilities


def test_make_runner_builds_the_invariant_step_the_plan_names(tiny_model) -> None:  # type: ignore[no-untyped-def]
    plan = executor_plan(tiny_model, torch.device("cuda"), "dense", batch_invariant="on").on(CPU)
    runner = make_executor(plan, tiny_model, 2)
    assert isinstance(runner, SlotForward) and isinstance(runner.step, TritonStep) and runner.step.invariant_products
    assert runner.capabilities == plan.capabilities
