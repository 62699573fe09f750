"""check_request: the one place a ``GenerateRequest`` is checked, before any work is done on it.

Two passes, each collecting every violation it finds:
1. the message itself (``size_limits.message_violations``): sizes, enum numbers, an unset grammar syntax, all
   O(1) in the fields' sizes, so a hostile field costs microseconds and nothing is converted yet;
2. the converted request (``validation.validate``): ranges, combinations, beam search, token ids against the
   model's vocabulary;
   and the output budget (domain/output_budget.py) under the caller's own cap on ``max_new_tokens``;
then the resolved ``max_new_tokens`` is written into the request (``budgeted``).

Later stages trust the result: the engine does not check these again. What only a later stage can know (the
prompt's length in tokens, whether a schema compiles, whether this model runs beam search) is refused there.
Every limit is read from the server's ``Settings`` instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proctor.api.call_info import CallInfo
from proctor.api.caller_limits import output_limits
from proctor.api.callers import Caller
from proctor.api.convert import request_from_proto
from proctor.api.size_limits import bounded_dict, message_violations
from proctor.api.validation import validate
from proctor.config import Settings
from proctor.domain import GenerationRequest, RequestValidationError
from proctor.domain.output_budget import budgeted
from proctor_client.v1 import generation_pb2 as pb


def check_request(message: pb.GenerateRequest, settings: Settings, *, time_remaining_s: float | None,
                  vocab_size: int | None = None, caller: Caller | None = None) -> GenerationRequest:
    """The request ``message`` asks for, checked; RequestValidationError names every bad field otherwise.

    ``vocab_size``: the model's (None before a model is attached: the ids are then not checked);
    ``caller``: the authenticated caller, whose token cap applies (None in open mode)."""
    bad = message_violations(message, settings)
    if bad:
        raise RequestValidationError(bad)
    request = request_from_proto(message, settings, time_remaining_s)
    limits = output_limits(settings, caller)
    bad = validate(request, settings, vocab_size, limits)
    if bad:
        raise RequestValidationError(bad)
    return budgeted(request, limits)


@dataclass(frozen=True, slots=True)
class ProtoIntake:
    """A ``GenerateRequest`` as the call layer takes it (api/generation_service.py's ``Intake``)."""

    message: pb.GenerateRequest

    def checked(self, settings: Settings, call: CallInfo, vocab_size: int | None) -> GenerationRequest:
        return check_request(self.message, settings, time_remaining_s=call.time_remaining(), vocab_size=vocab_size,
                             caller=call.caller)

    def as_received(self) -> dict[str, Any]:
        return bounded_dict(self.message)
