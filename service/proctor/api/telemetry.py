"""The server interceptor that observes every RPC: request metrics, the RPC's span, the log line.

It wraps each method handler's behaviour (all four gRPC kinds, coroutine or async-generator
style) so that the wrapper runs in the RPC's own task: it opens the call's observation (api/observer.py,
the same observer the HTTP door uses) and publishes it in the context variable of ``observability/calls.py``
(the call layer binds its audit call record to it and marks its stages), and when the behaviour returns or
raises it determines the status code from the RPC's context and records the call once.

It goes first in ``interceptors=``: calls another interceptor refuses (authentication) are observed too.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from proctor.api.observer import CallObserver, gone_code, publish, unpublish
from proctor.observability.calls import CallObservation
from proctor.observability.metrics import Metrics
from proctor.observability.tracing import Tracing

KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
FACTORIES = {"unary_unary": grpc.unary_unary_rpc_method_handler, "unary_stream": grpc.unary_stream_rpc_method_handler,
             "stream_unary": grpc.stream_unary_rpc_method_handler,
             "stream_stream": grpc.stream_stream_rpc_method_handler}


def status_code(context: grpc.aio.ServicerContext, exc: BaseException | None, observation: CallObservation) -> str:
    """The gRPC status the call ended with, as its name."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return gone_code(observation, context.time_remaining())
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    if isinstance(code, int):
        return next((c.name for c in grpc.StatusCode if c.value[0] == code), "UNKNOWN")
    return "OK" if exc is None else "UNKNOWN"


class TelemetryInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics | None, tracing: Tracing | None) -> None:
        self.observer = CallObserver(metrics, tracing)

    @property
    def metrics(self) -> Metrics | None:
        return self.observer.metrics

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
        observer = self.observer
        if inspect.isasyncgenfunction(behaviour):
            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                observation = observer.open(service, method, metadata, context.peer() or "")
                token = publish(observation)
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
                    observer.close(observation, status_code(context, failure, observation))
                    unpublish(token)
            return stream

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            observation = observer.open(service, method, metadata, context.peer() or "")
            token = publish(observation)
            try:
                result = await behaviour(request, context)
            except BaseException as exc:
                observer.close(observation, status_code(context, exc, observation))
                raise
            else:
                observer.close(observation, status_code(context, None, observation))
                return result
            finally:
                unpublish(token)
        return call
