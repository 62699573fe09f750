"""Whether rows are batch-invariant, known before the runner is built (executor/invariance.py): what the server
says and records, and ``--batch-invariant on`` refusing to start where rows are not."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from proctor.config import Settings
from proctor.executor.invariance import invariance_problem, rows_own_bits
from proctor.executor.llama_step import LlamaSlots
from proctor.models.info import model_info

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_slot_forward_keeps_rows_own_bits_on_the_cpu_only_and_says_so_as_its_runner_does(tiny_model) -> None:  # type: ignore[no-untyped-def]
    assert rows_own_bits(tiny_model, CPU) and not rows_own_bits(tiny_model, CUDA)
    assert LlamaSlots(tiny_model, 2, CPU).capabilities.rows_own_bits == rows_own_bits(tiny_model, CPU)
    unserved = SimpleNamespace(config=None)  # the per-slot runner runs each row alone: its own bits anywhere
    assert rows_own_bits(unserved, CUDA)


@pytest.mark.parametrize(("asked", "device", "refused"), [
    ("on", CUDA, True), ("on", CPU, False), ("auto", CUDA, False), ("off", CUDA, False), ("off", CPU, False)])
def test_on_refuses_to_start_where_no_step_keeps_rows_own_bits(tiny_model, asked: str, device: torch.device,  # type: ignore[no-untyped-def]
                                                               refused: bool) -> None:
    biased = copy.deepcopy(tiny_model)  # attention biases: neither the slot forward on CUDA nor the invariant step
    biased.config.attention_bias = True
    problem = invariance_problem(asked, biased, device)
    assert (problem is not None) == refused
    if problem is not None:
        assert "--batch-invariant on" in problem and "cuda" in problem and "Llama's arithmetic" in problem
        assert "--batch-invariant auto or off" in problem


def test_the_setting_is_one_of_its_modes() -> None:
    assert Settings(batch_invariant="on").batch_invariant == "on"
    with pytest.raises(ValueError, match="batch_invariant must be one of auto, on, off"):
        Settings(batch_invariant="yes")


def test_the_model_info_says_what_the_rows_are(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    info = model_info(tiny_loaded, Settings())
    assert info["batch_invariant"] is True and info["device"] == "cpu"


def test_on_selects_the_invariant_step_where_the_slot_forwards_rows_are_not_their_own(tiny_model) -> None:  # type: ignore[no-untyped-def]
    from proctor.executor.invariance import uses_invariant_step

    assert uses_invariant_step(tiny_model, CUDA, "on", "dense")  # Llama's arithmetic, heads of 16: it serves it
    assert rows_own_bits(tiny_model, CUDA, "on", "dense") and invariance_problem("on", tiny_model, CUDA) is None
    assert not uses_invariant_step(tiny_model, CPU, "on", "dense")  # the CPU's own step is invariant already
    assert not uses_invariant_step(tiny_model, CUDA, "auto", "dense")  # auto: what the runner offers
    problem = invariance_problem("on", tiny_model, CUDA, "fp16")
    assert problem is not None and "--weights dense" in problem and "--batch-invariant auto or off" in problem
