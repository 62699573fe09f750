"""Stopping criteria: each check returns ``Stop | None`` (a typed reason), never a bool and a string.

The built-ins are named criteria, checked after each committed token in this order:
``stop_token_ids`` → ``eos`` → ``repetition`` → ``max_new_tokens``; then, on the text released with
the token, ``stop_strings`` → stopping-criterion plugins (``plugin:<name>``, in request order, with
the finish reason ``STOP_CRITERION``). The others live where their data is: ``min_new_tokens``
is a mask (EOS is suppressed until it is reached), stop strings hold text back while streaming
(``stop_strings.py``), ``deadline`` and cancellation are checked between steps (``check_external``) and
``constraint_complete`` comes from the constraint's matcher.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from proctor.domain import FinishReason, RepetitionParams
from proctor.domain.output_budget import OutputBudget


@dataclass(frozen=True, slots=True)
class Stop:
    reason: FinishReason
    detail: str = ""


def repetition_stop(params: RepetitionParams, generated: Sequence[int],
                    forced: Sequence[bool] = ()) -> Stop | None:
    """The output ends in ``repeats`` consecutive copies of a unit of 1..``ngram_size`` tokens.

    ``forced`` (parallel to ``generated``, when known): steps where the masks left a single token. A span
    made only of such steps is not the model looping — a schema ``const`` such as ``25000`` spells its
    zeros whatever the model prefers — so it never ends the output."""
    for size in range(1, params.ngram_size + 1):
        span = size * params.repeats
        if len(generated) < span:
            break
        unit = generated[-size:]
        if forced and all(forced[-span:]):
            continue
        if all(generated[-span + i] == unit[i % size] for i in range(span - size)):
            return Stop(FinishReason.REPETITION,
                        f"the last {size} token(s) repeated {params.repeats} times in a row")
    return None


@dataclass(frozen=True, slots=True)
class TokenStopRules:
    """Token-level stop rules of one request, resolved against the model and server limits."""

    eos_token_ids: frozenset[int]
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    budget: OutputBudget
    repetition: RepetitionParams | None = None

    def check_token(self, token_id: int, generated: Sequence[int], forced: Sequence[bool] = ()) -> Stop | None:
        """Called after committing a token; ``generated`` includes it (``forced``: see ``repetition_stop``)."""
        if token_id in self.stop_token_ids:
            return Stop(FinishReason.STOP_TOKEN, f"stop token {token_id}")
        if not self.ignore_eos and token_id in self.eos_token_ids:
            return Stop(FinishReason.EOS)
        if self.repetition is not None:
            stop = repetition_stop(self.repetition, generated, forced)
            if stop is not None:
                return stop
        if self.budget.reached(len(generated)):
            return Stop(FinishReason.LENGTH, self.budget.detail)
        return None

    def suppress_eos(self, generated: int) -> bool:
        """EOS tokens are masked until ``min_new_tokens`` tokens were generated."""
        return self.budget.holds_end(generated) and bool(self.eos_token_ids)

    def is_last_step(self, generated: int) -> bool:
        """The next token is the last one the output budget allows."""
        return self.budget.last_step(generated)


def check_external(cancelled: bool, deadline: float | None, now: float | None = None) -> FinishReason | None:
    """Checks that come from outside the sequence: client cancellation, then the deadline."""
    if cancelled:
        return FinishReason.CANCELLED
    if deadline is not None and (now if now is not None else time.monotonic()) >= deadline:
        return FinishReason.DEADLINE
    return None
