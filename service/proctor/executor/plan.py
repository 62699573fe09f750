"""The executor plan: which executor serves a model on a device under the server's flags, decided once at start-up.

Why one plan: which executor runs, what it offers and how it is described used to be decided by ``make_executor``'s
own chain of checks and predicted again in four other homes (the start-up checks, GetModelInfo, the audit record,
beam admission), each of which could drift from what was built. Now ``executor_plan`` is the only function that
knows; ``make_executor`` (model_runner.py) builds what it says, and the rest read it. It reads the model's config and
the flags only, never the device itself, so a CUDA server's plan can be made (and tested) on a machine without one.

The kinds:

- ``per-slot``: an architecture the slot forward does not describe (families.py), on transformers' own forward;
- ``slot forward``: the batched slot forward (slot_forward.py), its products the C++ layer step's or the library's;
- ``invariant step``: ``--batch-invariant on`` where the slot forward's rows are not their own bits (CUDA): the
  Triton step with the invariant kernels' products (triton_step.py);
- ``graphed step``: ``--cuda-graphs`` on CUDA: the Triton step replayed as CUDA graphs (graph_step.py), its products
  the invariant kernels' with ``--batch-invariant on``, the library's otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import torch

from proctor.executor.families import EVERY_FAMILY_KERNELS, Family, describe, unsupported_reason, weights_problem
from proctor.executor.protocol import Capabilities
from proctor.executor.strategies import (
    Products,
    Replay,
    per_slot_capabilities,
    slot_capabilities,
    slot_products,
    triton_step_problem,
)


class ExecutorKind(StrEnum):
    PER_SLOT = "per-slot"
    SLOT_FORWARD = "slot forward"
    INVARIANT = "invariant step"
    GRAPHED = "graphed step"


@dataclass(frozen=True)
class ExecutorPlan:
    """What serves, decided before anything is built. ``weights``: the mode its products run (the per-slot executor
    runs the model's own dense weights whatever was asked). ``products`` and ``replay``: the slot forward's
    strategies (strategies.py; the per-slot executor: the library's, eagerly). ``largest_bucket``: the graphed step
    pads each step's rows to a power of two up to this. ``capabilities``: what the executor will offer
    (``thread_invariant`` as the strategies allow it; the built weights may not). ``beams``: whether beam search is
    admitted. ``description``: GetModelInfo.runner and the start-up log. ``problem``: why the server cannot start
    this way (None: it can)."""

    kind: ExecutorKind
    weights: str
    products: Products
    replay: Replay
    largest_bucket: int
    capabilities: Capabilities
    beams: bool
    description: str
    problem: str | None

    @property
    def device(self) -> torch.device:
        return self.capabilities.device

    @property
    def rows_own_bits(self) -> bool:
        """Whether every row's logits are its own bits whatever shares its forward: the audit record's and
        GetModelInfo's ``batch_invariant`` (a replay is refused across a difference, api/audit_servicer.py)."""
        return self.capabilities.rows_own_bits

    def on(self, device: torch.device) -> ExecutorPlan:
        """The same executor on another device (tests run CUDA's plans on the CPU, under Triton's interpreter)."""
        return replace(self, capabilities=replace(self.capabilities, device=device))


def executor_plan(model: Any, device: torch.device, weights: str, *, asked_weights: str = "auto",
                  batch_invariant: str = "auto", cuda_graphs: bool = False, step_tokens: int = 256) -> ExecutorPlan:
    """The plan for ``model`` on ``device`` in the resolved ``weights`` mode, the operator having asked for
    ``asked_weights``, ``--batch-invariant batch_invariant`` and ``--cuda-graphs`` (``cuda_graphs``), with steps of
    at most ``step_tokens`` rows."""
    unserved = unsupported_reason(model)
    if unserved is not None:
        return ExecutorPlan(
            kind=ExecutorKind.PER_SLOT, weights="dense", products="library", replay="eager",
            largest_bucket=step_tokens, capabilities=per_slot_capabilities(device), beams=False,
            description=f"per-slot: transformers' forward, one row at a time, dense weights ({unserved})",
            problem=_per_slot_problem(unserved, weights, asked_weights))
    family = describe(model.config)
    triton = triton_step_problem(model, weights)
    products: Products
    replay: Replay
    invariant_asked = batch_invariant == "on"
    kind, products, replay = ExecutorKind.SLOT_FORWARD, slot_products(family, weights), "eager"
    if cuda_graphs and device.type == "cuda" and triton is None:
        kind, products, replay = ExecutorKind.GRAPHED, "invariant" if invariant_asked else "library", "graphs"
    elif invariant_asked and not slot_capabilities(device, products, replay).rows_own_bits and triton is None:
        kind, products = ExecutorKind.INVARIANT, "invariant"
    capabilities = slot_capabilities(device, products, replay)
    problem = weights_problem(family, weights)
    if problem is None and invariant_asked and not capabilities.rows_own_bits:
        problem = (f"--batch-invariant on: rows on {device} are batch-invariant only through the batch-invariant "
                   f"step, and {triton}; start with --batch-invariant auto or off (the audit record then says so, "
                   "and a replay is refused across the difference), or on the CPU, where every row is")
    return ExecutorPlan(kind=kind, weights=weights, products=products, replay=replay, largest_bucket=step_tokens,
                        capabilities=capabilities, beams=True,
                        description=_describe(kind, family, weights, products), problem=problem)


def _per_slot_problem(unserved: str, weights: str, asked: str) -> str | None:
    """An architecture the slot forward does not serve runs on transformers' own forward with its dense weights:
    fine for ``auto`` (said in the description), a start-up error when a mode was asked for."""
    if weights == "gguf":  # the skeleton has no weights of its own for transformers' forward
        return (f"a .gguf file is served from its blocks on the batched slot forward only, which does not "
                f"serve this model: {unserved} (use --weights dense to dequantize it for transformers' forward)")
    if asked.strip().lower() not in ("auto", "", "dense"):
        return (f"--weights {asked} needs the batched slot forward, which does not serve this model: {unserved} "
                "(use --weights auto or dense to run it on transformers' own forward, one row at a time)")
    return None


def _describe(kind: ExecutorKind, family: Family, weights: str, products: Products) -> str:
    """Which forward serves, and why (GetModelInfo.runner, the start-up log)."""
    if kind is ExecutorKind.INVARIANT:
        return (f"invariant step: {family.name}, batched, {weights} weights, every product, norm and attention a "
                "batch-invariant Triton kernel (each row its own bits)")
    if kind is ExecutorKind.GRAPHED:
        how = ("products and norms by the batch-invariant Triton kernels (each row its own bits)"
               if products == "invariant" else "products by cuBLAS (rows not batch-invariant)")
        return (f"graphed step: {family.name}, batched, {weights} weights, steps padded to power-of-two row counts "
                f"and replayed as CUDA graphs, attention by the Triton kernel, {how}")
    if products == "kernels":
        return f"slot forward: {family.name}, batched, {weights} weights in the C++ decode kernels"
    computes = weights in EVERY_FAMILY_KERNELS or family.plain
    why = "" if weights not in ("q8", *EVERY_FAMILY_KERNELS) else (
        f"; the {weights} C++ kernel does not compute this family's layer" if not computes
        else "; head sizes the kernels lack")
    return f"slot forward: {family.name}, batched, {weights} weights through PyTorch operations{why}"
