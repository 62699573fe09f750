"""Every HTTP error as OpenAI's error object ``{"error": {"message", "type", "param", "code"}}``.

One table maps the call's gRPC status (the same status the gRPC door answers with, api/errors.py) to the HTTP
status and OpenAI's error type. A field violation's proto path is named by the body key that set it
(openai_http/fields.py), so ``param`` names what the caller sent. An internal error's message is api/errors.py's
fixed one with its error id, which also comes as the ``x-proctor-error-id`` header.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2
from starlette.responses import JSONResponse

from proctor.api.errors import status_for
from proctor.openai_http.context import HttpAbort

# gRPC status → (HTTP status, OpenAI error type)
HTTP_STATUS: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
    grpc.StatusCode.CANCELLED: (499, "cancelled_error"),
}
SERVER_ERROR = (500, "server_error")
ERROR_ID_HEADER = "x-proctor-error-id"
# A body refused before any work, as the gRPC status its call is observed (metrics, access log) under.
BODY_CODES = {404: grpc.StatusCode.NOT_FOUND, 413: grpc.StatusCode.RESOURCE_EXHAUSTED}


@dataclass(frozen=True, slots=True)
class BodyError(Exception):
    """A request body the HTTP door refuses before any work: ``param`` names the body key."""

    message: str
    param: str | None = None
    status: int = 400
    code: str | None = None

    def __str__(self) -> str:
        return self.message


def error_response(status: int, message: str, error_type: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": error_type, "param": param, "code": code}},
                        status_code=status, headers=headers)


def grpc_code_of(error: BodyError) -> grpc.StatusCode:
    """The status a refused body's call ends with (the gRPC door's for the same refusal)."""
    return BODY_CODES.get(error.status, grpc.StatusCode.INVALID_ARGUMENT)


def server_error_response(exc: BaseException) -> JSONResponse:
    """A 500 for an exception no status was given for: the error table's fixed message and id (logged there)."""
    status = status_for(exc)
    error_id = _error_id(status.details)
    http_status, kind = SERVER_ERROR
    return error_response(http_status, status.message, kind, None, "internal",
                          {ERROR_ID_HEADER: error_id} if error_id else None)


def body_error_response(error: BodyError) -> JSONResponse:
    kind = "invalid_request_error" if error.status in (400, 404, 413) else "server_error"
    return error_response(error.status, error.message, kind, error.param, error.code)


def abort_response(abort: HttpAbort, param_of: Callable[[str], str]) -> JSONResponse:
    """The HTTP answer to a call that ended with a status; ``param_of`` names a proto field by its body key."""
    status, kind = HTTP_STATUS.get(abort.code, SERVER_ERROR)
    param, headers, message = None, None, abort.message
    for packed in abort.status.details if abort.status is not None else ():
        if packed.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            packed.Unpack(bad)
            if bad.field_violations:  # named as the caller sent them, not as the proto spells them
                param = param_of(bad.field_violations[0].field)
                message = "; ".join(f"{param_of(v.field)}: {v.description}" for v in bad.field_violations)
        elif packed.Is(error_details_pb2.RequestInfo.DESCRIPTOR):
            headers = {ERROR_ID_HEADER: _error_id([packed])}
        elif packed.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            packed.Unpack(retry)
            delay = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
            headers = {"Retry-After": str(max(1, math.ceil(delay))),
                       "retry-after-ms": str(max(1, round(delay * 1000)))}
    if abort.code is grpc.StatusCode.RESOURCE_EXHAUSTED and headers is None:
        headers = {"Retry-After": "1"}
    if param is None and abort.code is grpc.StatusCode.INVALID_ARGUMENT:
        param = "request"
    return error_response(status, message, kind, param, abort.code.name.lower(), headers)


def _error_id(details: Iterable[any_pb2.Any]) -> str:
    """The error id an INTERNAL status carries (``RequestInfo.request_id``, api/errors.py), or ""."""
    for packed in details:
        if packed.Is(error_details_pb2.RequestInfo.DESCRIPTOR):
            info = error_details_pb2.RequestInfo()
            packed.Unpack(info)
            return str(info.request_id)
    return ""
