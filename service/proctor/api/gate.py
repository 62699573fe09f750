"""The one server interceptor every RPC passes: the admission rules, then safe request decoding.

Order per call, so that nothing is spent on a caller before it is admitted: the admission rules of
api/admission.py (the caller from its bearer token or client certificate, ``UNAUTHENTICATED``; its role,
``PERMISSION_DENIED``; its rate, ``RESOURCE_EXHAUSTED`` + ``RetryInfo``) → the request's bytes against the caller's
own ``max_request_bytes`` (``RESOURCE_EXHAUSTED``, as gRPC answers a message over its own limit) → the bytes
decoded here (undecodable bytes → ``INVALID_ARGUMENT``, not a traceback and ``UNKNOWN``) → the caller's
concurrent-generation slot. Health is exempt; reflection needs a known caller unless configured otherwise. Without
a callers file (loopback only) every caller is let through. A call that fails with anything but a status of its
own is answered by the one error table (api/failures.py: INTERNAL, a fixed message and an error id), never with
gRPC's ``UNKNOWN`` that quotes the exception.

The identity is published in a context variable (api/grpc_calls.py) for the servicers of the same call, which
describe the call to the call layer with it. Nothing here logs or returns a credential.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from proctor.api.admission import Admission
from proctor.api.call_info import Identity
from proctor.api.caller_limits import CallerLimiter, request_bytes_limit
from proctor.api.callers import GENERATING_METHODS, HEALTH_PREFIX, REFLECTION_PREFIXES, CallerBook
from proctor.api.errors import abort_code, abort_with
from proctor.api.grpc_calls import CURRENT_IDENTITY, call_info_of, current_identity
from proctor.domain import RequestValidationError

log = logging.getLogger("proctor.auth")
OFF_LOOP_DECODE_BYTES = 256 * 1024


class AccessRecorder(Protocol):
    """Records the calls of the methods it watches when they end (api/access_log.py: the reads of the log)."""

    def watches(self, method: str) -> bool: ...

    def record(self, method: str, request: Any, context: grpc.aio.ServicerContext, returned: int,
               error: BaseException | None) -> None: ...


class ServerGate(grpc.aio.ServerInterceptor):
    def __init__(self, book: CallerBook | None, *, reflection_needs_auth: bool = True,
                 max_request_bytes: int | None = None) -> None:
        self.rules = Admission(book)
        self.reflection_needs_auth = reflection_needs_auth
        self.max_request_bytes = max_request_bytes  # the server's limit (Settings.max_message_bytes)
        self.access: AccessRecorder | None = None  # set by the server: each Audit call, let through or refused

    @property
    def book(self) -> CallerBook | None:
        return self.rules.book

    @property
    def limiter(self) -> CallerLimiter:
        return self.rules.limiter

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        method = details.method
        if handler is None or method.startswith(HEALTH_PREFIX):
            return handler
        open_call = self.book is None or (method.startswith(REFLECTION_PREFIXES) and not self.reflection_needs_auth)
        admit = None if open_call else self.admission(method)
        slot = admit is not None and method in GENERATING_METHODS  # holds a concurrent-generation slot
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(handler.unary_unary, handler.request_deserializer,
                                                            admit, slot, method), request_deserializer=None)
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._stream(handler.unary_stream, handler.request_deserializer,
                                                              admit, slot, method), request_deserializer=None)
        if admit is None:
            return handler
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=self._unary(handler.stream_unary, None, admit, slot, method))
        return handler._replace(stream_stream=self._stream(handler.stream_stream, None, admit, slot, method))

    def admission(self, method: str) -> Callable[[grpc.aio.ServicerContext], Awaitable[Identity]]:
        """The admission rules of ``method``'s calls; a refusal is a domain error (the wrappers answer it)."""
        rules = self.rules

        async def admit(context: grpc.aio.ServicerContext) -> Identity:
            identity = rules.identify(method, call_info_of(context))
            assert identity is not None  # an open call is never admitted here
            CURRENT_IDENTITY.set(identity)  # known from here: a refusal's access record names the caller
            rules.authorize(method, identity)
            return identity

        return admit

    def _unary(self, behaviour: Any, deserialize: Any, admit: Any, slot: bool, method: str) -> Any:
        access = self.access if self.access is not None and self.access.watches(method) else None

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            decoded = None
            try:
                identity = await admit(context) if admit is not None else None
                decoded = await self._decode(deserialize, request, identity, context)
                with self.rules.generation_slot(identity if slot else None):
                    result = behaviour(decoded, context)
                    answer = await result if inspect.isawaitable(result) else result
            except BaseException as exc:
                failure = await _answered(exc, context)
                if access is not None:
                    access.record(method, decoded if decoded is not None else _for_record(deserialize, request),
                                  context, 0, failure)
                if failure is exc:
                    raise
                raise failure from exc
            if access is not None:
                access.record(method, decoded, context, 1, None)
            return answer

        return unary

    def _stream(self, behaviour: Any, deserialize: Any, admit: Any, slot: bool, method: str) -> Any:
        access = self.access if self.access is not None and self.access.watches(method) else None

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            decoded, sent = None, 0
            try:
                identity = await admit(context) if admit is not None else None
                decoded = await self._decode(deserialize, request, identity, context)
                with self.rules.generation_slot(identity if slot else None):
                    responses = behaviour(decoded, context)
                    try:
                        if hasattr(responses, "__aiter__"):
                            async for response in responses:
                                yield response
                                sent += 1
                        else:
                            for response in responses:
                                yield response
                                sent += 1
                    finally:
                        if hasattr(responses, "aclose"):
                            await responses.aclose()  # its cleanup (the engine abort of a cancelled stream) runs now
            except BaseException as exc:
                failure = await _answered(exc, context)
                if access is not None:
                    access.record(method, decoded if decoded is not None else _for_record(deserialize, request),
                                  context, sent, failure)
                if failure is exc:
                    raise
                raise failure from exc
            if access is not None:
                access.record(method, decoded, context, sent, None)

        return stream

    async def _decode(self, deserialize: Callable[[bytes], Any] | None, raw: Any, identity: Identity | None,
                      context: grpc.aio.ServicerContext) -> Any:
        """The request message, once its bytes are within its caller's limit (read after admission, so an
        unknown caller's bytes are never decoded)."""
        if deserialize is None:
            return raw
        caller = identity.caller if identity is not None else None
        limit = request_bytes_limit(caller, self.max_request_bytes) if caller is not None else None
        if caller is not None and limit is not None and len(raw) > limit:
            await abort_code(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"the request is {len(raw)} bytes; caller {caller.name!r} may send at most {limit} "
                             "(max_request_bytes)")
        return await _decode(deserialize, raw, context)


async def _decode(deserialize: Callable[[bytes], Any], raw: bytes, context: grpc.aio.ServicerContext) -> Any:
    try:
        if len(raw) > OFF_LOOP_DECODE_BYTES:  # a multi-megabyte parse would hold up every other call
            return await asyncio.to_thread(deserialize, raw)
        return deserialize(raw)
    except (DecodeError, ValueError, TypeError) as exc:
        # No field can be named in bytes that do not parse: the violation names the request as a whole.
        await abort_with(context, RequestValidationError.single(
            "request", f"the request bytes are not a valid message of this RPC's request type ({exc})"))
        raise


async def _answered(exc: BaseException, context: grpc.aio.ServicerContext) -> BaseException:
    """What a failed call raises: its own status (an abort, a cancel) as it is; any other exception is answered
    from the error table (a domain error, the admission rules' refusals included: its status; anything else:
    INTERNAL, logged with an error id), and that abort is what propagates."""
    if not isinstance(exc, Exception) or isinstance(exc, grpc.aio.AbortError):
        return exc
    try:
        await abort_with(context, exc)
    except BaseException as aborted:  # the abort (AbortError), or a cancel when the call is already gone
        return aborted
    return exc


def _for_record(deserialize: Callable[[bytes], Any] | None, raw: Any) -> Any:
    """The request an admitted caller was refused (its role, its rate) for its access record: what it asked for.
    An unknown caller's bytes stay undecoded (None: its record has no target)."""
    if deserialize is None or current_identity() is None or len(raw) > OFF_LOOP_DECODE_BYTES:
        return None
    try:
        return deserialize(raw)
    except (DecodeError, ValueError, TypeError):
        return None
