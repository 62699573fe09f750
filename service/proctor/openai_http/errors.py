"""Every HTTP error as OpenAI's error object ``{"error": {"message", "type", "param", "code"}}``.

One table maps the call's gRPC status (the same status the gRPC door answers with, api/errors.py) to the HTTP
status and OpenAI's error type. A field violation's proto path is named by the body key that set it
(openai_http/fields.py), so ``param`` names what the caller sent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2
from starlette.responses import JSONResponse

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
