"""Whether a row's logits are its own bits whatever shares its forward (batch invariance, issue 43), known before
the runner is built: the start-up check of ``--batch-invariant`` and the audit record's ``batch_invariant``.

Replay is the audit trail's strongest promise, and it holds only where a row's bits do not depend on the batch it
ran in. So the record says whether they did not, and a replay is refused across a difference
(api/audit_servicer.py) instead of diverging at some token for a reason nobody can see.
"""

from __future__ import annotations

from typing import Any

import torch

from proctor.executor.families import unsupported_reason


def slot_rows_own_bits(device: torch.device) -> bool:
    """The slot forward's rows: on the CPU every product, norm and attention takes each row through the same
    operations whatever is beside it (executor/llama_step.py); on CUDA the libraries pick their kernels by the
    batch's shape (measured on a lent H200: a request alone and among 16 diverged at token 20)."""
    return device.type == "cpu"


def rows_own_bits(model: Any, device: torch.device) -> bool:
    """Whether the runner ``make_runner`` builds for ``model`` on ``device`` keeps every row's bits its own (the
    per-slot runner runs each row alone: always)."""
    return unsupported_reason(model) is not None or slot_rows_own_bits(device)


def invariance_problem(asked: str, model: Any, device: torch.device) -> str | None:
    """Why the server cannot start ``model`` on ``device`` as ``--batch-invariant asked`` asks (None: it can)."""
    if asked == "on" and not rows_own_bits(model, device):
        return (f"--batch-invariant on: rows on {device} are not batch-invariant in this release (the libraries pick "
                "their kernels by the batch's shape); start with --batch-invariant auto or off (the audit record "
                "then says so, and a replay is refused across the difference), or on the CPU, where every row is")
    return None
