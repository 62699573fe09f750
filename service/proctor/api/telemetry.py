"""The server interceptor that observes every RPC: request metrics, the RPC's span, the log line.

It wraps each method handler's behaviour (all four gRPC kinds, coroutine or async-generator
style) so that the wrapper runs in the RPC's own task: it opens a ``CallObservation`` in the
context variable of ``observability/calls.py`` (the servicer binds its audit call record to it and
marks its stages), and when the behaviour returns or raises it determines the status code and
records the call once: ``Metrics.record_call``, ``Tracing.finish``, ``log_call``. A failure in the
telemetry itself is logged and never changes the RPC's outcome.

It goes first in ``interceptors=``: calls another interceptor refuses (authentication) are observed too.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from proctor.observability.calls import CURRENT, CallObservation
from proctor.observability.logs import log_call
from proctor.observability.metrics import Metrics
from proctor.observability.tracing import Tracing, caller_trace_id

log = logging.getLogger("proctor.observability")
KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
FACTORIES = {"unary_unary": grpc.unary_unary_rpc_method_handler, "unary_stream": grpc.unary_stream_rpc_method_handler,
             "stream_unary": grpc.stream_unary_rpc_method_handler,
             "stream_stream": grpc.stream_stream_rpc_method_handler}
CANCELLED_CODES = ("CANCELLED", "DEADLINE_EXCEEDED")


def status_code(context: grpc.aio.ServicerContext, exc: BaseException | None, observation: CallObservation) -> str:
    """The gRPC status the call ended with, as its name."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        recorded = getattr(observation.call, "status_code", "")
        if recorded in CANCELLED_CODES:
            return recorded
        remaining = context.time_remaining()
        return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    if isinstance(code, int):
        return next((c.name for c in grpc.StatusCode if c.value[0] == code), "UNKNOWN")
    return "OK" if exc is None else "UNKNOWN"


class TelemetryInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics | None, tracing: Tracing | None) -> None:
        self.metrics = metrics
        self.tracing = tracing

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        _, _, path = details.method.partition("/")
        service, _, method = path.partition("/")
        if handler is None:  # no such method: gRPC answers UNIMPLEMENTED
            if self.metrics is not None:
                self.metrics.requests.labels("unknown", "unknown", "UNIMPLEMENTED").inc()
            return None
        metadata = tuple(details.invocation_metadata or ())
        for kind in KINDS:
            behaviour = getattr(handler, kind)
            if behaviour is not None:
                wrapped = self.observe(behaviour, service, method, metadata)
                return FACTORIES[kind](wrapped, request_deserializer=handler.request_deserializer,
                                       response_serializer=handler.response_serializer)
        return handler

    def observe(self, behaviour: Callable[..., Any], service: str, method: str,
              metadata: tuple[Any, ...]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behaviour):
            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                observation = self._open(service, method, metadata, context)
                token = CURRENT.set(observation)
                inner = behaviour(request, context)
                failure: BaseException | None = None
                try:
                    async for item in inner:
                        yield item
                except BaseException as exc:
                    failure = exc
                    raise
                finally:
                    await inner.aclose()  # a no-op once it ended; else its cleanup (engine abort) runs now
                    self._close(observation, context, failure)
                    _reset(token)
            return stream

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            observation = self._open(service, method, metadata, context)
            token = CURRENT.set(observation)
            try:
                result = await behaviour(request, context)
            except BaseException as exc:
                self._close(observation, context, exc)
                raise
            else:
                self._close(observation, context, None)
                return result
            finally:
                _reset(token)
        return call

    def _open(self, service: str, method: str, metadata: tuple[Any, ...],
              context: grpc.aio.ServicerContext) -> CallObservation:
        observation = CallObservation(service, method, time.time_ns(), time.perf_counter(), peer=context.peer() or "")
        try:
            if self.tracing is not None:
                observation.span = self.tracing.start(observation, metadata)
            else:
                observation.trace_id = caller_trace_id(metadata)
        except Exception:
            log.exception("could not start the span of %s/%s", service, method)
        return observation

    def _close(self, observation: CallObservation, context: grpc.aio.ServicerContext,
               exc: BaseException | None) -> None:
        try:
            seconds = time.perf_counter() - observation.start_s
            code = status_code(context, exc, observation)
            if self.metrics is not None:
                self.metrics.record_call(observation, code, seconds)
            if self.tracing is not None and observation.span is not None:
                self.tracing.finish(observation.span, observation, code, time.time_ns())
            log_call(observation, code, seconds, observation.peer)
        except Exception:
            log.exception("could not record the call %s/%s", observation.service, observation.method)


def _reset(token: Any) -> None:
    with contextlib.suppress(ValueError):  # a generator finalised in another context: its task is gone anyway
        CURRENT.reset(token)
