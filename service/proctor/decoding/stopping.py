"""Stopping criteria: each check returns ``FinishReason | None``, never a bool and a string."""

from __future__ import annotations

import time
from dataclasses import dataclass

from proctor.domain import FinishReason


@dataclass(frozen=True, slots=True)
class TokenStopRules:
    """Token-level stop rules of one request, resolved against the model and server limits."""

    eos_token_ids: frozenset[int]
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    max_new_tokens: int
    min_new_tokens: int
    length_detail: str = ""

    def check_token(self, token_id: int, generated: int) -> FinishReason | None:
        """Called after committing a token; ``generated`` counts it."""
        if token_id in self.stop_token_ids:
            return FinishReason.STOP_TOKEN
        if not self.ignore_eos and token_id in self.eos_token_ids:
            return FinishReason.EOS
        if generated >= self.max_new_tokens:
            return FinishReason.LENGTH
        return None

    def suppress_eos(self, generated: int) -> bool:
        """EOS tokens are masked until ``min_new_tokens`` tokens were generated."""
        return generated < self.min_new_tokens and bool(self.eos_token_ids)


def check_external(cancelled: bool, deadline: float | None, now: float | None = None) -> FinishReason | None:
    """Checks that come from outside the sequence: client cancellation, then the deadline."""
    if cancelled:
        return FinishReason.CANCELLED
    if deadline is not None and (now if now is not None else time.monotonic()) >= deadline:
        return FinishReason.DEADLINE
    return None
