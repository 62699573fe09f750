"""The one table that maps domain errors to gRPC status codes (rule 7 of DESIGN.md).

A status's message is for the caller, so it says what the caller can act on. Bad input names its fields
(``INVALID_ARGUMENT`` with ``BadRequest``), overload says when to retry, a drain says to go elsewhere: those
messages are written for the caller where they are raised. An internal cause (the audit store, the engine, a
plugin, anything unexpected) is not: its text may hold a host, a user, SQL or a path. It is logged here, once,
with its cause and a fresh error id, and the caller gets a fixed message naming that id (and the id again as
``google.rpc.RequestInfo.request_id``, which AIP-193 gives to "identify requests in the service's logs"). The
audit record's status is built by this table too, so it holds the id, never the internal text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from proctor.domain import Overloaded, RequestValidationError, ShuttingDown

log = logging.getLogger("proctor.errors")
INTERNAL_MESSAGE = "internal error (error id {error_id}): see the server log"
_ERROR_ID = "proctor_error_id"  # the attribute an exception keeps its id in, so both its uses show one id


def status_for(exc: BaseException) -> status_pb2.Status:
    """Build the google.rpc.Status (code, message, typed details) for a domain error."""
    if isinstance(exc, RequestValidationError):
        detail = error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in exc.violations])
        return _status(code_pb2.INVALID_ARGUMENT, str(exc), detail)
    if isinstance(exc, Overloaded):
        retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
            seconds=exc.retry_after_ms // 1000, nanos=(exc.retry_after_ms % 1000) * 1_000_000))
        return _status(code_pb2.RESOURCE_EXHAUSTED, str(exc), retry)
    if isinstance(exc, ShuttingDown):
        return _status(code_pb2.UNAVAILABLE, str(exc))
    return internal_status(exc)  # an EngineFault (AuditWriteFailed, ModerationFault) or anything unexpected


def internal_status(exc: BaseException) -> status_pb2.Status:
    """INTERNAL with the fixed message and ``exc``'s error id: nothing of its text reaches the caller."""
    error_id = error_id_of(exc)
    return _status(code_pb2.INTERNAL, INTERNAL_MESSAGE.format(error_id=error_id),
                   error_details_pb2.RequestInfo(request_id=error_id))


def error_id_of(exc: BaseException) -> str:
    """The id ``exc`` is logged under; the first call logs it with its cause (a call's audit record and its
    answer both ask, and must name the same id)."""
    known = getattr(exc, _ERROR_ID, None)
    if isinstance(known, str):
        return known
    error_id = secrets.token_hex(8)
    with contextlib.suppress(AttributeError):  # a frozen exception: logged again if asked again, under a new id
        setattr(exc, _ERROR_ID, error_id)
    cause = exc.__cause__ or exc.__context__
    because = f" (caused by {type(cause).__name__}: {cause})" if cause is not None and str(cause) not in str(exc) \
        else ""
    log.error("error id %s: %s: %s%s", error_id, type(exc).__name__, exc, because, exc_info=exc)
    return error_id


def _status(code: int, message: str, detail: object | None = None) -> status_pb2.Status:
    status = status_pb2.Status(code=code, message=message)
    if detail is not None:
        packed = any_pb2.Any()
        packed.Pack(detail)
        status.details.append(packed)
    return status


async def abort_with(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    """Abort the call with the mapped status (raises, as ``context.abort`` does)."""
    await _sent(context.abort_with_status(rpc_status.to_status(status_for(exc))))


async def abort_code(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    """``context.abort(code, message)`` for a call that may already be over (raises, as abort does)."""
    await _sent(context.abort(code, message))


async def _sent(aborting: Awaitable[None]) -> None:
    """Send an abort; a call that ended meanwhile (its deadline passed, its client left) can take no status,
    and gRPC then fails the send: that is a cancel (``CancelledError``), not an error of this server."""
    try:
        await aborting
    except grpc.aio.AbortError:
        raise
    except Exception as exc:  # cygrpc's ExecuteBatchError or UsageError: the call is gone
        raise asyncio.CancelledError(f"the call ended before its status could be sent ({exc})") from exc
