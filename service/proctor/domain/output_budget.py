"""The output budget: the one answer to "how many new tokens may this request have, at least, at most, and left".

A request's ``max_new_tokens`` used to be resolved in four places (the front checks, the caller's cap, the
engine's preparation, the closing rule) and "tokens left" computed six ways; the front checked
``min_new_tokens`` against the server's default while the caller's cap later lowered the maximum, so a minimum
above the cap was served short without a word. Now one function resolves the limits in one order:

1. ``max_new_tokens`` as asked, else the server's default (``OutputLimits.server_default``);
2. the caller's cap (callers file): an unset value takes the lower of the two, a higher one is refused;
3. the server's cap (``--max-new-tokens-limit``): a higher value is refused;
4. ``min_new_tokens`` against the result: a minimum no output may reach is refused, naming the field;

and, once the input is tokenized, the context (``within_context``) may lower the maximum further, saying so.
Every later stage (stop rules, drafts, beams, the closing rule, the batch's KV reservation, usage) asks the
``OutputBudget`` value, never ``max_new_tokens`` itself. Plain Python: no protobuf, no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from proctor.domain.errors import FieldViolation, RequestValidationError
from proctor.domain.request import GenerationRequest, StoppingParams

MAX_FIELD = "stopping.max_new_tokens"
MIN_FIELD = "stopping.min_new_tokens"


@dataclass(frozen=True, slots=True)
class OutputLimits:
    """What bounds a request's output besides the request: the server's default and cap, the caller's cap."""

    server_default: int
    server_cap: int
    caller_cap: int | None = None
    caller_name: str = ""


@dataclass(frozen=True, slots=True)
class OutputBudget:
    """One request's output in tokens: at least ``min_new_tokens`` (end tokens are held off until then), at most
    ``max_new_tokens``; ``detail`` says why the maximum is lower than asked (the context), for a LENGTH finish."""

    max_new_tokens: int
    min_new_tokens: int = 0
    detail: str = ""

    def left(self, generated: int) -> int:
        """Tokens still allowed after ``generated``."""
        return max(0, self.max_new_tokens - generated)

    def reached(self, generated: int) -> bool:
        """``generated`` tokens end the output (finish LENGTH)."""
        return generated >= self.max_new_tokens

    def last_step(self, generated: int) -> bool:
        """The next token, after ``generated``, is the last one allowed."""
        return generated + 1 >= self.max_new_tokens

    def holds_end(self, generated: int) -> bool:
        """End tokens are masked after ``generated`` tokens: the minimum is not reached yet."""
        return generated < self.min_new_tokens

    def draft_room(self, generated: int) -> int:
        """Positions a draft may fill after the next token (the KV cache holds prompt + ``max_new_tokens``)."""
        return self.max_new_tokens - generated - 1

    def within_context(self, room: int, context_length: int) -> OutputBudget:
        """This budget in a context that leaves ``room`` tokens after the input: the maximum lowered to it (said in
        ``detail``); refused naming ``stopping.min_new_tokens`` when the room cannot hold the minimum."""
        if room >= self.max_new_tokens:
            return self
        if room < self.min_new_tokens:
            raise RequestValidationError.single(
                MIN_FIELD, f"{self.min_new_tokens} exceeds the {room} new tokens the context ({context_length}) "
                           "leaves after the input")
        return OutputBudget(room, self.min_new_tokens,
                            f"capped at {room} new tokens by the context length ({context_length})")

    def require(self, tokens: int, what: str) -> None:
        """Refuse, naming ``stopping.max_new_tokens``, a budget that cannot hold ``tokens`` (``what`` they are)."""
        if tokens > self.max_new_tokens:
            capped = f" ({self.detail})" if self.detail else ""
            raise RequestValidationError.single(
                MAX_FIELD, f"{self.max_new_tokens} tokens{capped} cannot hold {what}: ask for at least {tokens}")


def output_budget(stopping: StoppingParams, limits: OutputLimits) -> OutputBudget:
    """The request's budget under ``limits``; RequestValidationError names every field out of bounds."""
    bad: list[FieldViolation] = []
    cap, asked = limits.caller_cap, stopping.max_new_tokens
    if asked is None:
        most = min(limits.server_default, limits.server_cap, cap if cap is not None else limits.server_cap)
    else:
        most = asked
        if asked < 1 or asked > limits.server_cap:
            bad.append(FieldViolation(MAX_FIELD, f"must be between 1 and the server cap {limits.server_cap}, "
                                                 f"got {asked}"))
        elif cap is not None and asked > cap:
            bad.append(FieldViolation(MAX_FIELD, f"caller {limits.caller_name!r} may ask for at most {cap} new "
                                                 f"tokens, got {asked}"))
    least = stopping.min_new_tokens
    if least < 0:
        bad.append(FieldViolation(MIN_FIELD, f"must be >= 0, got {least}"))
    elif least > most:
        whose = f", caller {limits.caller_name!r}'s cap" if cap is not None and most == cap else ""
        bad.append(FieldViolation(MIN_FIELD, f"{least} exceeds max_new_tokens ({most}{whose})"))
    if bad:
        raise RequestValidationError(bad)
    return OutputBudget(most, least)


def budgeted(request: GenerationRequest, limits: OutputLimits) -> GenerationRequest:
    """``request`` with its resolved ``max_new_tokens`` written in, so every later stage (the engine, the audit
    record, a replay on a server with another default) reads the same number; refused as ``output_budget``."""
    most = output_budget(request.stopping, limits).max_new_tokens
    if most == request.stopping.max_new_tokens:
        return request
    return dataclasses.replace(request, stopping=dataclasses.replace(request.stopping, max_new_tokens=most))
