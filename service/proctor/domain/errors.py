"""Domain errors; ``api/failures.py`` maps each to one status in a single table, which each door answers in its own
form (gRPC: ``api/errors.py``; HTTP: ``openai_http/errors.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """A bad field, named by its protobuf path (e.g. ``sampling.top_p``)."""

    field: str
    description: str


MAX_VIOLATIONS = 10  # field violations reported per request (the last one counts the rest)


class RequestValidationError(ValueError):
    """The request is invalid; maps to INVALID_ARGUMENT with BadRequest field violations."""

    def __init__(self, violations: list[FieldViolation] | FieldViolation) -> None:
        found = [violations] if isinstance(violations, FieldViolation) else list(violations)
        if len(found) > MAX_VIOLATIONS:  # a status trailer a default gRPC client can still read
            rest = len(found) - (MAX_VIOLATIONS - 1)
            found = [*found[: MAX_VIOLATIONS - 1], FieldViolation(found[MAX_VIOLATIONS - 1].field,
                                                                  f"... and {rest} more violations")]
        self.violations = found
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in self.violations))

    @classmethod
    def single(cls, field: str, description: str) -> RequestValidationError:
        return cls(FieldViolation(field, description))

    def renamed(self, fields: Mapping[str, str]) -> RequestValidationError:
        """The same violations under the names the caller set them by (a contract's ``max_new_tokens`` is its
        attempts' ``stopping.max_new_tokens``)."""
        return RequestValidationError([FieldViolation(fields.get(v.field, v.field), v.description)
                                       for v in self.violations])


class Overloaded(RuntimeError):
    """The waiting queue is full; maps to RESOURCE_EXHAUSTED with a retry hint."""

    def __init__(self, message: str, retry_after_ms: int = 1000) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class EngineFault(RuntimeError):
    """The engine failed; maps to INTERNAL (and health NOT_SERVING when it cannot recover)."""


class ShuttingDown(RuntimeError):
    """The server is draining and takes no new requests; maps to UNAVAILABLE (clients retry elsewhere)."""


class Unauthenticated(PermissionError):
    """No known caller: neither a bearer token nor a client certificate names one; maps to UNAUTHENTICATED."""


class PermissionDenied(PermissionError):
    """The caller is known but lacks the role the call needs; maps to PERMISSION_DENIED."""


class DeadlineExceeded(TimeoutError):
    """The call's deadline passed while it ran (its record says so); maps to DEADLINE_EXCEEDED."""
