"""The one table that maps domain errors to gRPC status codes (rule 7 of DESIGN.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from proctor.domain import EngineFault, Overloaded, RequestValidationError, ShuttingDown


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
    if isinstance(exc, EngineFault):
        return _status(code_pb2.INTERNAL, str(exc))
    return _status(code_pb2.INTERNAL, f"internal error: {type(exc).__name__}")


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
