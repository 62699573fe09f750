"""One call observed, whichever door it came through: metrics, its span and its log line, recorded once.

A door opens a ``CallObservation`` when a call arrives (its service and method: the gRPC method, or the HTTP
route's template), publishes it in the context variable of ``observability/calls.py`` while the call runs (the
call layer binds its audit record to it and marks its stages), and closes it once with the status the call ended
with, by name (gRPC's names; the HTTP door's labels are the same names). The gRPC door does this in its server
interceptor (api/telemetry.py), the HTTP door in its routes (openai_http/routes.py). A failure in the telemetry
itself is logged and never changes the call's outcome.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from contextvars import Token
from typing import Any

from proctor.observability.calls import CURRENT, CallObservation
from proctor.observability.logs import log_call
from proctor.observability.metrics import Metrics
from proctor.observability.tracing import Tracing, caller_trace_id

log = logging.getLogger("proctor.observability")
CANCELLED_CODES = ("CANCELLED", "DEADLINE_EXCEEDED")


class CallObserver:
    """Opens and records the observations of calls (``metrics`` and ``tracing``: None when off)."""

    def __init__(self, metrics: Metrics | None, tracing: Tracing | None) -> None:
        self.metrics = metrics
        self.tracing = tracing

    def open(self, service: str, method: str, metadata: Sequence[tuple[str, Any]], peer: str) -> CallObservation:
        """A new observation of a call that arrives now (its trace continued from ``metadata``'s traceparent)."""
        observation = CallObservation(service, method, time.time_ns(), time.perf_counter(), peer=peer)
        try:
            if self.tracing is not None:
                observation.span = self.tracing.start(observation, metadata)
            else:
                observation.trace_id = caller_trace_id(metadata)
        except Exception:
            log.exception("could not start the span of %s/%s", service, method)
        return observation

    def close(self, observation: CallObservation, code: str) -> None:
        """Record the call once: its status ``code``, its duration, its span and its log line."""
        try:
            seconds = time.perf_counter() - observation.start_s
            if self.metrics is not None:
                self.metrics.record_call(observation, code, seconds)
            if self.tracing is not None and observation.span is not None:
                self.tracing.finish(observation.span, observation, code, time.time_ns())
            log_call(observation, code, seconds, observation.peer)
        except Exception:
            log.exception("could not record the call %s/%s", observation.service, observation.method)


def gone_code(observation: CallObservation, time_remaining: float | None) -> str:
    """The status of a call whose caller went away: what its record says (a deadline it ran out of), else its
    deadline's, else a cancel."""
    recorded = getattr(observation.call, "status_code", "")
    if recorded in CANCELLED_CODES:
        return str(recorded)
    return "DEADLINE_EXCEEDED" if time_remaining is not None and time_remaining <= 0 else "CANCELLED"


def publish(observation: CallObservation) -> Token[CallObservation | None]:
    """Make ``observation`` the current call's (observability/calls.py), until ``unpublish``."""
    return CURRENT.set(observation)


def unpublish(token: Token[CallObservation | None]) -> None:
    with contextlib.suppress(ValueError):  # a generator finalised in another context: its task is gone anyway
        CURRENT.reset(token)
