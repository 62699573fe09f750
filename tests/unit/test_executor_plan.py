"""The executor plan (executor/plan.py): made once from the model, the device and the flags, it is what
``make_executor`` builds, what GetModelInfo and the audit record say (``runner``, ``batch_invariant``), what the
server refuses to start on and whether beam search is admitted.

Every executor the CPU builds is built here from its plan and held to it; a CUDA server's plans are made without a
GPU (the plan reads flags, never the device), and the graphed and invariant ones are built on the CPU, under
Triton's interpreter, through ``ExecutorPlan.on``.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from test_families import build

from proctor.executor import fused_decode
from proctor.executor.build import PerSlotExecutor, make_executor
from proctor.executor.plan import ExecutorKind, ExecutorPlan, executor_plan
from proctor.executor.protocol import Executor, Feed
from proctor.executor.slot_forward import SlotForward
from proctor.executor.smoothing import calibration_ids
from proctor.executor.weights import fbgemm_available
from proctor.models.info import model_info

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def cpu_modes() -> list[str]:
    found = ["dense", "fp16"]
    if fbgemm_available() and fused_decode.load_problem() is None:
        found += ["q8", "q4"]
    return found


def gpt2(vocab: int) -> Any:
    import transformers  # not a family of executor/families.py

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=vocab, n_positions=256)
    return transformers.GPT2LMHeadModel(config).eval()


def assert_built_as_planned(runner: Executor, plan: ExecutorPlan) -> None:
    """The runner is the plan's kind, with its strategies, and offers what the plan said it would (the thread count
    aside: the built weights may take ``thread_invariant`` back, never give it)."""
    if plan.kind is ExecutorKind.PER_SLOT:
        assert isinstance(runner, PerSlotExecutor)
    else:
        assert isinstance(runner, SlotForward)
        assert (runner.products, runner.replay) == (plan.products, plan.replay)
    offered = runner.capabilities
    assert dataclasses.replace(offered, thread_invariant=plan.capabilities.thread_invariant) == plan.capabilities
    assert offered.thread_invariant <= plan.capabilities.thread_invariant


def serve_a_step(runner: Executor) -> torch.Tensor:
    with torch.inference_mode():
        runner.forward([Feed(0, [5, 6, 7], 1)])
        return runner.forward([Feed(0, [8], 1), Feed(1, [9, 10], 1)])


@pytest.mark.parametrize("mode", cpu_modes())
def test_the_slot_forward_is_built_and_described_as_planned(tiny_loaded, tokenizer, mode: str) -> None:  # type: ignore[no-untyped-def]
    loaded = dataclasses.replace(tiny_loaded, weights=mode)
    plan = executor_plan(loaded.model, CPU, mode)
    runner = make_executor(plan, loaded.model, 2, calibration_ids(tokenizer))
    assert plan.kind is ExecutorKind.SLOT_FORWARD and plan.problem is None and plan.beams
    assert_built_as_planned(runner, plan)
    assert serve_a_step(runner).shape == (2, loaded.vocab_size)
    info = model_info(loaded, plan)
    assert info["runner"] == plan.description and info["batch_invariant"] is plan.rows_own_bits is True
    kernels = mode in ("q8", "q4")
    assert (plan.products == "kernels") is kernels
    assert plan.description == (f"slot forward: llama, batched, {mode} weights in the C++ decode kernels" if kernels
                                else f"slot forward: llama, batched, {mode} weights through PyTorch operations")


def test_gguf_blocks_are_built_and_described_as_planned(default_gguf: Path, tmp_path: Path) -> None:
    from helpers.gguf_writer import tiny_loaded_from_gguf, write_gguf
    from helpers.requirements import missing

    if fused_decode.load_problem() is not None:
        missing(f"the decode kernels: {fused_decode.load_problem()}")
    skeleton = tiny_loaded_from_gguf(write_gguf(build("qwen3"), default_gguf, tmp_path / "qwen3.gguf"))
    plan = executor_plan(skeleton, CPU, "gguf", asked_weights="gguf")
    assert plan.products == "kernels" and plan.problem is None
    assert plan.description == "slot forward: qwen3, batched, gguf weights in the C++ decode kernels"
    runner = make_executor(plan, skeleton, 2)
    assert_built_as_planned(runner, plan)
    assert serve_a_step(runner).shape[0] == 2


def test_an_unsupported_architecture_is_planned_and_built_per_slot(tiny_loaded, tokenizer) -> None:  # type: ignore[no-untyped-def]
    model = gpt2(len(tokenizer))
    loaded = dataclasses.replace(tiny_loaded, model=model, weights="fp16")  # auto chose fp16: it runs dense
    plan = executor_plan(model, CPU, "fp16")
    assert plan.kind is ExecutorKind.PER_SLOT and plan.weights == "dense" and not plan.beams
    assert plan.problem is None and "'gpt2'" in plan.description
    assert plan.description.startswith("per-slot: transformers' forward, one row at a time, dense weights")
    runner = make_executor(plan, model, 2)
    assert_built_as_planned(runner, plan)
    serve_a_step(runner)
    info = model_info(loaded, plan)
    assert info["runner"] == plan.description and info["batch_invariant"] is True
    asked = executor_plan(model, CPU, "q4", asked_weights="q4")  # a mode asked for: refused at start-up
    assert asked.problem is not None and "--weights q4 needs the batched slot forward" in asked.problem
    with pytest.raises(ValueError, match="needs the batched slot forward"):
        make_executor(asked, model, 2)
    gguf = executor_plan(model, CPU, "gguf", asked_weights="gguf")
    assert gguf.problem is not None and "slot forward only" in gguf.problem


@pytest.mark.parametrize(("invariant", "products"), [("auto", "library"), ("off", "library"), ("on", "invariant")])
def test_a_cuda_server_with_graphs_plans_the_graphed_step(tiny_model, invariant: str, products: str) -> None:  # type: ignore[no-untyped-def]
    plan = executor_plan(tiny_model, CUDA, "dense", batch_invariant=invariant, cuda_graphs=True, step_tokens=64)
    assert (plan.kind, plan.products, plan.replay) == (ExecutorKind.GRAPHED, products, "graphs")
    assert plan.largest_bucket == 64
    assert plan.description.startswith("graphed step: llama, batched, dense weights")
    assert "CUDA graphs" in plan.description and plan.problem is None and plan.beams
    own = products == "invariant"
    assert plan.rows_own_bits is own and plan.capabilities.extend is own and plan.device == CUDA
    assert ("batch-invariant Triton kernels" in plan.description) is own
    assert ("rows not batch-invariant" in plan.description) is not own


def test_a_cuda_server_without_graphs_plans_the_invariant_step_only_when_asked(tiny_model) -> None:  # type: ignore[no-untyped-def]
    invariant = executor_plan(tiny_model, CUDA, "dense", batch_invariant="on")
    assert (invariant.kind, invariant.products, invariant.replay) == (ExecutorKind.INVARIANT, "invariant", "eager")
    assert invariant.rows_own_bits and invariant.problem is None
    assert invariant.description.startswith("invariant step: llama, batched, dense weights")
    plain = executor_plan(tiny_model, CUDA, "dense")
    assert (plain.kind, plain.products) == (ExecutorKind.SLOT_FORWARD, "library") and not plain.rows_own_bits
    assert not plain.capabilities.extend  # no drafts where a row's bits are not its own
    on_cpu = executor_plan(tiny_model, CPU, "dense", batch_invariant="on", cuda_graphs=True)
    assert on_cpu.kind is ExecutorKind.SLOT_FORWARD and on_cpu.rows_own_bits  # the CPU's own step already is


def test_what_the_triton_step_cannot_serve_falls_back_or_is_refused_on_cuda(tiny_model) -> None:  # type: ignore[no-untyped-def]
    fp16 = executor_plan(tiny_model, CUDA, "fp16", cuda_graphs=True)  # the kernels multiply the model's matrices
    assert fp16.kind is ExecutorKind.SLOT_FORWARD and fp16.problem is None
    refused = executor_plan(tiny_model, CUDA, "fp16", batch_invariant="on", cuda_graphs=True)
    assert refused.problem is not None and "--weights dense" in refused.problem
    assert "--batch-invariant auto or off" in refused.problem
    biased = copy.deepcopy(tiny_model)
    biased.config.attention_bias = True
    plan = executor_plan(biased, CUDA, "dense", batch_invariant="on")
    assert plan.kind is ExecutorKind.SLOT_FORWARD and plan.problem is not None
    assert "Llama's arithmetic" in plan.problem and "cuda" in plan.problem
