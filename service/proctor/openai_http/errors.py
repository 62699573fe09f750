"""Every HTTP error as OpenAI's error object ``{"error": {"message", "type", "param", "code"}}``.

One table maps the status a call failed with (api/failures.py: the same table and the same status the gRPC door
answers with) to the HTTP status and OpenAI's error type. A field violation's proto path is named by the body key
that set it (openai_http/fields.py), so ``param`` names what the caller sent. An internal error's message is the
table's fixed one with its error id, which also comes as the ``x-proctor-error-id`` header.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import JSONResponse

from proctor.api.failures import Failure, failure_of

# status (by name) → (HTTP status, OpenAI error type)
HTTP_STATUS: dict[str, tuple[int, str]] = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "FAILED_PRECONDITION": (400, "invalid_request_error"),
    "OUT_OF_RANGE": (400, "invalid_request_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "NOT_FOUND": (404, "not_found_error"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "UNAVAILABLE": (503, "service_unavailable_error"),
    "DEADLINE_EXCEEDED": (504, "timeout_error"),
    "CANCELLED": (499, "cancelled_error"),
}
SERVER_ERROR = (500, "server_error")
ERROR_ID_HEADER = "x-proctor-error-id"
# A body refused before any work, as the status its call is observed (metrics, access log) under.
BODY_CODES = {404: "NOT_FOUND", 413: "RESOURCE_EXHAUSTED"}


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


def status_of(error: BodyError) -> str:
    """The status a refused body's call ends with (the gRPC door's for the same refusal)."""
    return BODY_CODES.get(error.status, "INVALID_ARGUMENT")


def body_error_response(error: BodyError) -> JSONResponse:
    kind = "invalid_request_error" if error.status in (400, 404, 413) else "server_error"
    return error_response(error.status, error.message, kind, error.param, error.code)


def failure_response(exc: BaseException, param_of: Callable[[str], str]) -> JSONResponse:
    """The HTTP answer to a call that failed with ``exc`` (a domain error; anything else is a 500 with an error id,
    logged there); ``param_of`` names a field violation's proto path by its body key."""
    failure = failure_of(exc)
    status, kind = HTTP_STATUS.get(failure.code, SERVER_ERROR)
    param, message = None, failure.message
    if failure.violations:  # named as the caller sent them, not as the proto spells them
        param = param_of(failure.violations[0].field)
        message = "; ".join(f"{param_of(v.field)}: {v.description}" for v in failure.violations)
    if param is None and failure.code == "INVALID_ARGUMENT":
        param = "request"
    return error_response(status, message, kind, param, failure.code.lower(), _headers(failure))


def _headers(failure: Failure) -> dict[str, str] | None:
    if failure.error_id:
        return {ERROR_ID_HEADER: failure.error_id}
    if failure.retry_after_ms is not None:
        delay = failure.retry_after_ms / 1000
        return {"Retry-After": str(max(1, math.ceil(delay))), "retry-after-ms": str(max(1, round(delay * 1000)))}
    if failure.code == "RESOURCE_EXHAUSTED":
        return {"Retry-After": "1"}
    return None
