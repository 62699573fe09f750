"""The graphed step (executor/graph_step.py) on the CPU, where nothing is captured but everything else runs: steps
padded to row buckets through static buffers give every real row the unpadded step's bits, a bucket's step is
captured once and replayed with new inputs, captured again when the cache moves, and a capture that fails leaves
the step eager. Under Triton's interpreter, on a tiny Llama of 256 tokens (the interpreter runs the LM head's tiles
one by one: the real vocabulary's 49,152 would take minutes)."""

from __future__ import annotations

import pytest
import torch
from helpers.requirements import require_module

require_module("proctor.executor.invariant_kernels")  # before anything else imports triton

from proctor.executor.build import make_executor  # noqa: E402
from proctor.executor.graph_step import GraphReplay, bucket_for, row_buckets  # noqa: E402
from proctor.executor.plan import ExecutorKind, executor_plan  # noqa: E402
from proctor.executor.protocol import Feed  # noqa: E402
from proctor.executor.slot_forward import SlotForward  # noqa: E402
from proctor.executor.strategies import Capture, Step  # noqa: E402

CPU = torch.device("cpu")
PROMPT = [2, 45, 200, 17, 82, 9, 61, 241, 13]


def graphed_slots(model, slots: int, invariant: bool, largest_bucket: int, capture: Capture) -> SlotForward:  # type: ignore[no-untyped-def]
    return SlotForward(model, slots, CPU, "dense", products="invariant" if invariant else "library", replay="graphs",
                       largest_bucket=largest_bucket, capture=capture)


def replay_of(runner: SlotForward) -> GraphReplay:
    assert isinstance(runner.step, GraphReplay)
    return runner.step


def invariant_slots(model, slots: int) -> SlotForward:  # type: ignore[no-untyped-def]
    return SlotForward(model, slots, CPU, "dense", products="invariant")


@pytest.fixture(scope="module")
def small_model():  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=512,
                         tie_word_embeddings=True, initializer_range=0.2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).float().eval().requires_grad_(False)


class CountingCapture:
    """Stands in for CUDA's capture only: runs the step once, as the warm-up does, and hands back the very step,
    so a replay computes from whatever the bucket's static buffers hold at that moment."""

    def __init__(self) -> None:
        self.steps: list[Step] = []

    def __call__(self, step: Step) -> Step:
        step()
        self.steps.append(step)
        return step


def test_buckets_are_powers_of_two_up_to_the_step_budget() -> None:
    assert row_buckets(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert row_buckets(100)[-1] == 128 and row_buckets(1) == (1,)
    assert [bucket_for(rows, row_buckets(16)) for rows in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, None]


def test_padded_steps_give_every_row_the_unpadded_steps_bits(small_model) -> None:  # type: ignore[no-untyped-def]
    """Prompt pieces, decode rows and drafts in steps of 3, 5, 1, 6 and 19 rows (padded to 4, 8, 1, 8; 19 past the
    largest bucket, eager): logits, lengths and every held cache position the same bits as the unpadded step."""
    capture = CountingCapture()
    graphed = graphed_slots(small_model, 4, True, 8, capture)
    plain = invariant_slots(small_model, 4)
    steps = [
        [Feed(0, PROMPT[:3], 1)],
        [Feed(0, [77], 1), Feed(1, PROMPT[:4], 0)],
        [Feed(1, PROMPT[4:5], 1)],
        [Feed(0, [78, 79], 2), Feed(1, [80], 1), Feed(2, [81, 82, 83], 1)],
        [Feed(3, PROMPT * 2, 1), Feed(0, [84], 1)],
    ]
    with torch.inference_mode():
        for feeds in steps:
            assert torch.equal(graphed.forward(feeds), plain.forward(feeds))
            assert graphed.lengths == plain.lengths
    assert replay_of(graphed).captures == 3 and len(capture.steps) == 3  # buckets 4, 8 and 1; the 19-row step eager
    for layer in range(len(graphed._keys)):
        for slot, length in enumerate(plain.lengths):
            assert torch.equal(graphed._keys[layer][slot, :, :length], plain._keys[layer][slot, :, :length])
            assert torch.equal(graphed._values[layer][slot, :, :length], plain._values[layer][slot, :, :length])


def test_a_bucket_is_replayed_with_new_inputs_and_captured_again_when_the_cache_moves(small_model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from proctor.executor import slot_cache

    monkeypatch.setattr(slot_cache, "KV_GROWTH_TOKENS", 16)  # the cache grows in steps of 16 positions, not 256
    capture = CountingCapture()
    graphed = graphed_slots(small_model, 2, True, 4, capture)
    plain = invariant_slots(small_model, 2)
    long_prompt = (PROMPT * 2)[:10]
    with torch.inference_mode():
        for runner in (graphed, plain):
            runner.forward([Feed(0, long_prompt, 1)])  # 10 rows: past the largest bucket, eager
        for token in (5, 6, 7):  # one row each: bucket 1, captured once, replayed with each token and position
            assert torch.equal(graphed.forward([Feed(0, [token], 1)]), plain.forward([Feed(0, [token], 1)]))
        assert replay_of(graphed).captures == 1
        first_cache = graphed._keys[0]
        for token in (8, 9, 10):  # positions 13 … 15: a step keeps one spare, so the last grows the cache past 16
            assert torch.equal(graphed.forward([Feed(0, [token], 1)]), plain.forward([Feed(0, [token], 1)]))
    assert graphed._keys[0].data_ptr() != first_cache.data_ptr()
    assert replay_of(graphed).captures == 2  # the bucket's graph held the old cache's address: captured again


def test_a_capture_that_fails_leaves_every_step_eager_and_right(small_model) -> None:  # type: ignore[no-untyped-def]
    def refuse(step: Step) -> Step:
        raise RuntimeError("operation not permitted when stream is capturing")

    graphed = graphed_slots(small_model, 2, True, 4, refuse)
    plain = invariant_slots(small_model, 2)
    with torch.inference_mode():
        for feeds in ([Feed(0, PROMPT, 2)], [Feed(0, [5], 1), Feed(1, [6, 7], 1)]):
            assert torch.equal(graphed.forward(feeds), plain.forward(feeds))
    assert replay_of(graphed).captures == 0 and "stream is capturing" in replay_of(graphed).graphs_failed


@pytest.mark.parametrize("invariant", [True, False])
def test_both_modes_compute_the_models_logits(small_model, invariant: bool) -> None:  # type: ignore[no-untyped-def]
    """PyTorch's products (``--batch-invariant off``) and the kernels' give the model's own logits to float
    tolerance, padded."""
    graphed = graphed_slots(small_model, 2, invariant, 16, CountingCapture())
    with torch.inference_mode():
        mine = graphed.forward([Feed(0, PROMPT, len(PROMPT))])
        theirs = small_model(torch.tensor([PROMPT])).logits[0].float()
    assert torch.allclose(mine, theirs, atol=2e-4, rtol=1e-4)
    # PyTorch's products on plain matrices promise no row its own bits (the library picks its kernel by the rows):
    # drafts only with the kernels'
    assert graphed.capabilities.rows_own_bits is invariant and graphed.capabilities.extend is invariant


def test_the_graph_step_is_planned_on_cuda_for_the_models_its_kernels_serve(tiny_model) -> None:  # type: ignore[no-untyped-def]
    cuda = torch.device("cuda")  # a device value only: nothing is allocated on it

    def kind(device: torch.device, graphs: bool, weights: str = "dense") -> ExecutorKind:
        return executor_plan(tiny_model, device, weights, cuda_graphs=graphs).kind

    assert kind(cuda, True) is ExecutorKind.GRAPHED
    assert kind(cuda, False) is ExecutorKind.SLOT_FORWARD  # --no-cuda-graphs
    assert kind(CPU, True) is ExecutorKind.SLOT_FORWARD  # nothing to capture on the CPU
    assert kind(cuda, True, "fp16") is ExecutorKind.SLOT_FORWARD  # the kernels multiply the model's own matrices


@pytest.mark.parametrize(("asked", "products"), [("auto", "library"), ("on", "invariant")])
def test_make_runner_builds_the_graphed_step_the_plan_names(small_model, asked: str, products: str) -> None:  # type: ignore[no-untyped-def]
    plan = executor_plan(small_model, torch.device("cuda"), "dense", batch_invariant=asked, cuda_graphs=True,
                         step_tokens=8).on(CPU)
    runner = make_executor(plan, small_model, 2)
    assert isinstance(runner, SlotForward) and (runner.products, runner.replay) == (products, "graphs")
    assert replay_of(runner).buckets == (1, 2, 4, 8) and replay_of(runner).rows.invariant_products is (asked == "on")
    assert runner.capabilities == plan.capabilities


def test_the_engine_serves_on_the_graph_step_with_the_default_steps_tokens(make_engine, tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    """The engine on the plan ``--cuda-graphs`` makes on CUDA (built here on the CPU, eager): plain and beam requests
    in one batch, a prompt in pieces of a 16-token step budget, give the default step's tokens."""
    from helpers.engine import serve_plain_and_beams

    prompt = "The printing press changed Europe"
    expected = serve_plain_and_beams(make_engine(max_step_tokens=16, max_batch_size=4), prompt)
    plan = executor_plan(tiny_loaded.model, torch.device("cuda"), "dense", cuda_graphs=True, step_tokens=16).on(CPU)
    engine = make_engine(max_step_tokens=16, max_batch_size=4, plan=plan)
    assert serve_plain_and_beams(engine, prompt) == expected
    runner = engine._batch._executor
    assert isinstance(runner, SlotForward) and replay_of(runner).buckets[-1] == 16 and replay_of(runner).captures > 0
