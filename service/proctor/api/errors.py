"""A domain error as the gRPC door answers it: the ``google.rpc.Status`` of api/failures.py's ``Failure``.

The table itself (which error ends a call with which status, and what an internal cause's caller is told) is
api/failures.py, shared by both doors; here it takes gRPC's form: the code, the message, and the typed details
(``BadRequest`` field violations, ``RetryInfo``, ``RequestInfo`` naming the error id).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from proctor.api.failures import failure_of


def status_for(exc: BaseException) -> status_pb2.Status:
    """Build the google.rpc.Status (code, message, typed details) for a domain error."""
    failure = failure_of(exc)
    details: list[object] = []
    if failure.violations:
        details.append(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in failure.violations]))
    if failure.retry_after_ms is not None:
        ms = failure.retry_after_ms
        details.append(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
            seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)))
    if failure.error_id:
        details.append(error_details_pb2.RequestInfo(request_id=failure.error_id))
    return _status(code_pb2.Code.Value(failure.code), failure.message, *details)


def _status(code: int, message: str, *details: object) -> status_pb2.Status:
    status = status_pb2.Status(code=code, message=message)
    for detail in details:
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
