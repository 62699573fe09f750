"""One exception type for every failed call, so callers never handle raw ``grpc.RpcError``.

The server reports bad requests as INVALID_ARGUMENT with a ``grpc-status-details-bin`` trailer holding a
``google.rpc.Status`` with a ``google.rpc.BadRequest`` detail. Decoding it needs googleapis-common-protos,
which this distribution does not require: without it the field violations stay empty and the status message
(which names the fields too) is all there is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

try:
    from google.rpc import error_details_pb2, status_pb2
except ImportError:  # pragma: no cover - depends on the environment
    error_details_pb2 = None
    status_pb2 = None

STATUS_DETAILS_KEY = "grpc-status-details-bin"


class ProctorError(Exception):
    """A failed call: gRPC status code, message, and the (field, description) pairs of a BadRequest."""

    def __init__(self, code: grpc.StatusCode, message: str, field_violations: Iterable[tuple[str, str]] = (),
                 retry_after_s: float | None = None) -> None:
        self.code: grpc.StatusCode = code
        self.message: str = message
        self.field_violations: list[tuple[str, str]] = [(str(f), str(d)) for f, d in field_violations]
        self.retry_after_s: float | None = retry_after_s  # the server's RetryInfo hint (RESOURCE_EXHAUSTED)
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.code.name}: {self.message}"
        if self.field_violations:
            text += " (" + "; ".join(f"{field}: {description}" for field, description in self.field_violations) + ")"
        return text

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle by their args; ours are rendered text, so rebuild from the fields instead.
        return (type(self), (self.code, self.message, self.field_violations, self.retry_after_s))

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> ProctorError:
        """Build from a sync or asyncio RpcError, decoding BadRequest field violations when possible."""
        code = _call(error, "code")
        message = _call(error, "details")
        trailing = _call(error, "trailing_metadata") or ()
        blob = next((value for key, value in trailing if key == STATUS_DETAILS_KEY), None)
        status_message, violations = decode_status_details(blob) if isinstance(blob, bytes) else ("", [])
        retry = decode_retry_delay(blob) if isinstance(blob, bytes) else None
        if not isinstance(code, grpc.StatusCode):
            code = grpc.StatusCode.UNKNOWN
        return cls(code, message or status_message or str(error), violations, retry)


def decode_status_details(blob: bytes) -> tuple[str, list[tuple[str, str]]]:
    """Return (status message, field violations) from a serialized google.rpc.Status; empty when undecodable."""
    if status_pb2 is None or error_details_pb2 is None:
        return "", []
    try:
        status = status_pb2.Status.FromString(blob)
    except DecodeError:
        return "", []
    violations: list[tuple[str, str]] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            violations.extend((v.field, v.description) for v in bad_request.field_violations)
    return status.message, violations


def decode_retry_delay(blob: bytes) -> float | None:
    """The RetryInfo delay in seconds from a serialized google.rpc.Status, or None."""
    if status_pb2 is None or error_details_pb2 is None:
        return None
    try:
        status = status_pb2.Status.FromString(blob)
    except DecodeError:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return None


def _call(error: grpc.RpcError, name: str) -> Any:
    """Call an accessor of a grpc.Call if the error has it (a bare RpcError has none)."""
    accessor = getattr(error, name, None)
    if not callable(accessor):
        return None
    try:
        return accessor()
    except Exception:  # an accessor of a half-built call must not hide the original error
        return None
