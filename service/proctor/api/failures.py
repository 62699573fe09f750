"""The one table from a domain error to how a failed call is answered (rule 7 of DESIGN.md), for every door.

A ``Failure`` is transport-free: the status by its name (gRPC's names, ``INVALID_ARGUMENT`` ..., which are also the
label every door's metrics, logs and audit records use), the message, and the typed facts a door turns into its own
form: the field violations, the retry delay, the error id. The gRPC door sends it as a ``google.rpc.Status``
(api/errors.py); the HTTP door as OpenAI's error object with its HTTP status (openai_http/errors.py).

A status's message is for the caller, so it says what the caller can act on. Bad input names its fields, overload
says when to retry, a drain says to go elsewhere: those messages are written for the caller where they are raised.
An internal cause (the audit store, the engine, a plugin, anything unexpected) is not: its text may hold a host, a
user, SQL or a path. It is logged here, once, with its cause and a fresh error id, and the caller gets a fixed
message naming that id (and the id again as ``google.rpc.RequestInfo.request_id`` on gRPC, which AIP-193 gives to
"identify requests in the service's logs", and as ``x-proctor-error-id`` over HTTP). The audit record's status is
built by this table too, so it holds the id, never the internal text.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from dataclasses import dataclass

from proctor.domain import (
    DeadlineExceeded,
    FieldViolation,
    Overloaded,
    PermissionDenied,
    RequestValidationError,
    ShuttingDown,
    Unauthenticated,
)

log = logging.getLogger("proctor.errors")
INTERNAL_MESSAGE = "internal error (error id {error_id}): see the server log"
_ERROR_ID = "proctor_error_id"  # the attribute an exception keeps its id in, so both its uses show one id
# The domain errors whose own message is the answer, by the status they end a call with.
CODES: tuple[tuple[type[BaseException], str], ...] = (
    (RequestValidationError, "INVALID_ARGUMENT"),
    (Overloaded, "RESOURCE_EXHAUSTED"),
    (ShuttingDown, "UNAVAILABLE"),
    (Unauthenticated, "UNAUTHENTICATED"),
    (PermissionDenied, "PERMISSION_DENIED"),
    (DeadlineExceeded, "DEADLINE_EXCEEDED"),
)


@dataclass(frozen=True, slots=True)
class Failure:
    """How a failed call is answered: its status name, message and typed details."""

    code: str
    message: str
    violations: tuple[FieldViolation, ...] = ()  # INVALID_ARGUMENT: every bad field, by its proto path
    retry_after_ms: int | None = None  # RESOURCE_EXHAUSTED: when to try again
    error_id: str = ""  # INTERNAL: the id the cause is logged under


def failure_of(exc: BaseException) -> Failure:
    """The answer to a call that ended with ``exc`` (an unexpected one is logged here with its error id)."""
    code = next((name for kind, name in CODES if isinstance(exc, kind)), None)
    if code is None:  # an EngineFault (AuditWriteFailed, ModerationFault) or anything unexpected
        error_id = error_id_of(exc)
        return Failure("INTERNAL", INTERNAL_MESSAGE.format(error_id=error_id), error_id=error_id)
    violations = tuple(exc.violations) if isinstance(exc, RequestValidationError) else ()
    retry = exc.retry_after_ms if isinstance(exc, Overloaded) else None
    return Failure(code, str(exc), violations, retry)


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
