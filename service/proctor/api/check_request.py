"""check_request: the one place a request is checked, before any work is done on it, whichever door it came through.

Two passes, each collecting every violation it finds:
1. the sizes (api/size_limits.py): on the gRPC message itself (``message_violations``: also its enum numbers
   and an unset grammar syntax), all O(1) in the fields' sizes, so a hostile field costs microseconds and nothing
   is converted yet; or, for the HTTP door, on the request its body converted into (``request_violations``, the
   same limits from the same table, with what the door found wrong in the wire form: ``DraftIntake``);
2. the converted request, with the server's parts added (``with_server_parts``: the request id when none is
   given, the deadline, the server's own screens and moderators), against the rules (``validation.validate``:
   ranges, combinations, beam search, token ids against the model's vocabulary) and the output budget
   (domain/output_budget.py) under the caller's own cap on ``max_new_tokens``;
then the resolved ``max_new_tokens`` is written into the request (``budgeted``).

Later stages trust the result: the engine does not check these again. What only a later stage can know (the
prompt's length in tokens, whether a schema compiles, whether this model runs beam search) is refused there.
Every limit is read from the server's ``Settings`` instance.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proctor.api.call_info import CallInfo
from proctor.api.caller_limits import output_limits
from proctor.api.callers import Caller
from proctor.api.convert import request_from_proto, request_to_proto
from proctor.api.size_limits import bounded_dict, message_violations, request_violations
from proctor.api.validation import validate
from proctor.config import Settings, plugin_calls_setting
from proctor.domain import FieldViolation, GenerationRequest, PluginCall, RequestValidationError
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
    return checked(request_from_proto(message), settings, time_remaining_s, vocab_size, caller)


def checked(converted: GenerationRequest, settings: Settings, time_remaining_s: float | None,
            vocab_size: int | None, caller: Caller | None) -> GenerationRequest:
    """A converted request whose sizes passed, with the server's parts, checked against the rules and budgeted."""
    request = with_server_parts(converted, settings, time_remaining_s)
    limits = output_limits(settings, caller)
    bad = validate(request, settings, vocab_size, limits)
    if bad:
        raise RequestValidationError(bad)
    return budgeted(request, limits)


def with_server_parts(request: GenerationRequest, settings: Settings,
                      time_remaining_s: float | None) -> GenerationRequest:
    """``request`` as this server runs it: a request id (a fresh one when it has none), the call's deadline, and
    the server's own input screens and output moderators before the request's."""
    return dataclasses.replace(
        request, request_id=request.request_id or uuid.uuid4().hex,
        deadline=None if time_remaining_s is None else time.monotonic() + time_remaining_s,
        input_screens=default_plugin_calls(settings, "input_screens") + request.input_screens,
        output_moderators=default_plugin_calls(settings, "output_moderators") + request.output_moderators)


def default_plugin_calls(settings: Settings, field: str) -> tuple[PluginCall, ...]:
    """The server's own screens or moderators (``field``: "input_screens" or "output_moderators"), named
    ``settings.<field>[i]`` in errors and in the audit record."""
    return tuple(PluginCall(name, json.loads(params), f"settings.{field}[{i}]")
                 for i, (name, params) in enumerate(plugin_calls_setting(field, getattr(settings, field))))


@dataclass(frozen=True, slots=True)
class ProtoIntake:
    """A ``GenerateRequest`` as the call layer takes it (api/generation_service.py's ``Intake``)."""

    message: pb.GenerateRequest

    def checked(self, settings: Settings, call: CallInfo, vocab_size: int | None) -> GenerationRequest:
        return check_request(self.message, settings, time_remaining_s=call.time_remaining(), vocab_size=vocab_size,
                             caller=call.caller)

    def as_received(self) -> dict[str, Any]:
        return bounded_dict(self.message)


@dataclass(frozen=True, slots=True)
class DraftIntake:
    """A request a door converted without a message (the HTTP door's body), as the call layer takes it.

    ``violations``: what the door found wrong that the request cannot hold (an enum number the proto does not
    define, a grammar without its syntax), named by proto path; they are reported with the size checks'."""

    request: GenerationRequest
    violations: Sequence[FieldViolation] = ()

    def checked(self, settings: Settings, call: CallInfo, vocab_size: int | None) -> GenerationRequest:
        bad = [*request_violations(self.request, settings), *self.violations]
        if bad:
            raise RequestValidationError(bad)
        return checked(self.request, settings, call.time_remaining(), vocab_size, call.caller)

    def as_received(self) -> dict[str, Any]:
        """The request as a gRPC call's record keeps one: the message that asks for it (api/convert.py)."""
        return bounded_dict(request_to_proto(self.request))
