"""One observation per RPC, reachable from anywhere the call's code runs (a context variable).

The server interceptor (``api/telemetry.py``) opens a ``CallObservation`` when an RPC arrives and
closes it when the RPC ends. The code in between marks its stages with ``stage(name)``; the marks
are plain wall-clock nanoseconds, so recording costs a clock read and a list append (no spans, no
locks). ``asyncio.to_thread`` copies the context, so marks made on a worker thread (constraint
compile during preparation) land in the same observation. Without an open observation (start-up
compiles, engine tests) every function here does nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

# Stage names (the spans of a call, DESIGN.md's flow): the API's validation of the message, the
# engine's preparation (tokenize, masks, constraint), one compile per constraint engine tried, and
# the audit record's commit. Queue wait, prefill and decode come from the engine's final timings.
VALIDATE = "validate"
PREPARE = "prepare"
COMPILE = "constraint.compile"
AUDIT_COMMIT = "audit.commit"


@dataclass(slots=True)
class Stage:
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass(slots=True)
class CallObservation:
    """What is known about one RPC: where it started, its stages, and the audit call record."""

    service: str
    method: str
    start_ns: int  # wall clock (time.time_ns), for spans
    start_s: float  # time.perf_counter, for durations
    trace_id: str = ""  # 32 hex digits, or "" when neither the caller nor tracing gave one
    span_id: str = ""
    call: Any = None  # the audit trail's CallRecord, once the servicer opened it
    stages: list[Stage] = field(default_factory=list)
    span: Any = None  # the RPC's span while tracing is on
    peer: str = ""  # read when the call arrives: asking a finished call's context for it can crash grpc

    def final_event(self) -> Any:
        """The engine's final event of this call (usage, timings, finish reason), or None."""
        events = getattr(self.call, "events", None)
        if events and events[-1].finished:
            return events[-1]
        return None

    def stage_end_ns(self, name: str) -> int:
        """When the last stage called ``name`` ended (0: never)."""
        for stage in reversed(self.stages):
            if stage.name == name:
                return stage.end_ns
        return 0


CURRENT: ContextVar[CallObservation | None] = ContextVar("proctor_call_observation", default=None)


def current() -> CallObservation | None:
    return CURRENT.get()


@contextmanager
def stage(name: str, **attributes: Any) -> Iterator[dict[str, Any]]:
    """Mark the enclosed code as stage ``name`` of the current call; yields its attribute dict."""
    observation = CURRENT.get()
    if observation is None:
        yield attributes
        return
    start = time.time_ns()
    error = ""
    try:
        yield attributes
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
        raise
    finally:
        observation.stages.append(Stage(name, start, time.time_ns(), attributes, error))


C = TypeVar("C")  # the audit call record (observability stays below audit/: it does not name the type)


def bind_call(call: C) -> C:
    """Attach the audit call record to the current observation and give it the call's trace id."""
    observation = CURRENT.get()
    if observation is not None:
        observation.call = call
        if observation.trace_id and hasattr(call, "trace_id"):
            call.trace_id = observation.trace_id
    return call
