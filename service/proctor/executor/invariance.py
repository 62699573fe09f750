"""Whether a row's logits are its own bits whatever shares its forward (batch invariance, issue 43), known before
the runner is built: the start-up check of ``--batch-invariant`` and the audit record's ``batch_invariant``.

Replay is the audit trail's strongest promise, and it holds only where a row's bits do not depend on the batch it
ran in. So the record says whether they did not, and a replay is refused across a difference
(api/audit_servicer.py) instead of diverging at some token for a reason nobody can see.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from proctor.executor.families import describe, unsupported_reason


def slot_rows_own_bits(device: torch.device) -> bool:
    """The slot forward's rows: on the CPU every product, norm and attention takes each row through the same
    operations whatever is beside it (executor/llama_step.py); on CUDA the libraries pick their kernels by the
    batch's shape (measured on a lent H200: a request alone and among 16 diverged at token 20)."""
    return device.type == "cpu"


def invariant_step_problem(model: Any, weights: str) -> str | None:
    """Why the batch-invariant step (executor/invariant_step.py) cannot serve ``model`` in ``weights`` mode (None:
    it can): it computes Llama's arithmetic with the model's own dense matrices, heads of a power-of-two size."""
    reason = unsupported_reason(model)
    if reason is not None:
        return f"the slot forward does not serve this model ({reason})"
    family = describe(model.config)
    if not family.plain:
        return (f"it computes Llama's arithmetic exactly; {family.name} differs (biases, norms, windows or "
                "softcaps the kernels do not take yet)")
    if family.head_dim & (family.head_dim - 1):
        return f"its attention takes head sizes that are powers of two, not {family.head_dim}"
    if weights != "dense":
        return f"it multiplies the model's own matrices (--weights dense), not --weights {weights}"
    if importlib.util.find_spec("triton") is None:
        return "triton, which compiles its kernels, is not installed"
    return None


def uses_invariant_step(model: Any, device: torch.device, asked: str, weights: str) -> bool:
    """Whether ``make_runner`` builds the batch-invariant step: asked for, where the slot forward's own rows are
    not their own bits, and able to serve the model."""
    return asked == "on" and not slot_rows_own_bits(device) and invariant_step_problem(model, weights) is None


def uses_graph_step(model: Any, device: torch.device, cuda_graphs: bool, weights: str) -> bool:
    """Whether ``make_runner`` builds the graphed step (executor/graph_step.py): on CUDA with ``--cuda-graphs``, for a
    model its kernels serve (its products are the kernels' only with ``--batch-invariant on``)."""
    return cuda_graphs and device.type == "cuda" and invariant_step_problem(model, weights) is None


def rows_own_bits(model: Any, device: torch.device, asked: str = "auto", weights: str = "dense") -> bool:
    """Whether the runner ``make_runner`` builds for ``model`` on ``device`` keeps every row's bits its own (the
    per-slot runner runs each row alone: always)."""
    return (unsupported_reason(model) is not None or slot_rows_own_bits(device)
            or uses_invariant_step(model, device, asked, weights))


def invariance_problem(asked: str, model: Any, device: torch.device, weights: str = "dense") -> str | None:
    """Why the server cannot start ``model`` on ``device`` as ``--batch-invariant asked`` asks (None: it can)."""
    if asked == "on" and not rows_own_bits(model, device, asked, weights):
        return (f"--batch-invariant on: rows on {device} are batch-invariant only through the batch-invariant step, "
                f"and {invariant_step_problem(model, weights)}; start with --batch-invariant auto or off (the audit "
                "record then says so, and a replay is refused across the difference), or on the CPU, where every "
                "row is")
    return None
