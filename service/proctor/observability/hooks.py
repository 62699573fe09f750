"""What the engine, the constraint compiler and the audit sink report to, when metrics are on.

Each component holds an ``observer`` that is None by default (metrics off: nothing is recorded
and nothing here is imported at run time). ``metrics.Metrics`` implements all three. The calls are
cheap by contract: the engine makes at most three per step (prefill, decode, masks), never one per token.
"""

from __future__ import annotations

from typing import Protocol


class StepObserver(Protocol):
    """Called on the engine thread."""

    def prefill(self, seconds: float, requests: int) -> None:
        """A step fed prompt tokens (beside the decoding rows, in one forward); ``requests`` prompts completed."""

    def decode_step(self, seconds: float, rows: int) -> None:
        """A step that fed no prompt: one batched decode (forward, pipeline, commit) over ``rows`` requests."""

    def masks(self, seconds: float, removed_by: list[str]) -> None:
        """A step's masks were built (only steps with any mask); ``removed_by`` per row (pipeline)."""


class CompileObserver(Protocol):
    def compiled(self, engine: str, seconds: float, ok: bool) -> None:
        """One constraint engine compiled (or refused) a spec that was not in the cache."""


class AuditObserver(Protocol):
    def audit_written(self, seconds: float, records: int, ok: bool) -> None:
        """The audit writer committed (or failed to commit) a batch of ``records`` records."""
