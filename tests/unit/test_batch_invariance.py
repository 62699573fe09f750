"""Whether rows are batch-invariant, known from the executor plan before the runner is built (executor/plan.py):
what the server says and records, and ``--batch-invariant on`` refusing to start where rows are not."""

from __future__ import annotations

import copy

import pytest
import torch

from proctor.config import Settings
from proctor.engine.executor_setup import plan_for
from proctor.executor.plan import executor_plan
from proctor.executor.slot_forward import SlotForward
from proctor.models.info import model_info

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_slot_forward_keeps_rows_own_bits_on_the_cpu_only_and_says_so_as_its_runner_does(tiny_model) -> None:  # type: ignore[no-untyped-def]
    assert executor_plan(tiny_model, CPU, "dense").rows_own_bits
    assert not executor_plan(tiny_model, CUDA, "dense").rows_own_bits
    assert SlotForward(tiny_model, 2, CPU).capabilities.rows_own_bits == executor_plan(tiny_model, CPU,
                                                                                        "dense").rows_own_bits


@pytest.mark.parametrize(("asked", "device", "refused"), [
    ("on", CUDA, True), ("on", CPU, False), ("auto", CUDA, False), ("off", CUDA, False), ("off", CPU, False)])
def test_on_refuses_to_start_where_no_step_keeps_rows_own_bits(tiny_model, asked: str, device: torch.device,  # type: ignore[no-untyped-def]
                                                               refused: bool) -> None:
    biased = copy.deepcopy(tiny_model)  # attention biases: neither the slot forward on CUDA nor the invariant step
    biased.config.attention_bias = True
    problem = executor_plan(biased, device, "dense", batch_invariant=asked).problem
    assert (problem is not None) == refused
    if problem is not None:
        assert "--batch-invariant on" in problem and "cuda" in problem and "Llama's arithmetic" in problem
        assert "--batch-invariant auto or off" in problem


def test_the_setting_is_one_of_its_modes() -> None:
    assert Settings(batch_invariant="on").batch_invariant == "on"
    with pytest.raises(ValueError, match="batch_invariant must be one of auto, on, off"):
        Settings(batch_invariant="yes")


def test_the_model_info_says_what_the_rows_are(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    info = model_info(tiny_loaded, plan_for(tiny_loaded, Settings()))
    assert info["batch_invariant"] is True and info["device"] == "cpu"


def test_on_selects_the_invariant_step_where_the_slot_forwards_rows_are_not_their_own(tiny_model) -> None:  # type: ignore[no-untyped-def]
    on = executor_plan(tiny_model, CUDA, "dense", batch_invariant="on")
    assert on.products == "invariant"  # Llama's arithmetic, heads of 16: it serves it
    assert on.rows_own_bits and on.problem is None
    assert executor_plan(tiny_model, CPU, "dense", batch_invariant="on").products == "library"  # invariant already
    assert executor_plan(tiny_model, CUDA, "dense").products == "library"  # auto: what the runner offers
    problem = executor_plan(tiny_model, CUDA, "fp16", batch_invariant="on").problem
    assert problem is not None and "--weights dense" in problem and "--batch-invariant auto or off" in problem
