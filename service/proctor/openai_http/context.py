"""An HTTP request seen as a gRPC call: what the gate, the servicers and the telemetry read of a call.

The HTTP door runs the very code the gRPC door runs (api/gate.py, api/servicer.py, api/telemetry.py), so the
callers, roles, limits, admission, audit and metrics rules are written once. Those read a
``grpc.aio.ServicerContext``; ``HttpCallContext`` answers the same questions for an HTTP request, and an
abort raises ``HttpAbort`` (a ``grpc.aio.AbortError``, so every layer treats it as gRPC's own) carrying the
status the HTTP answer is built from (openai_http/errors.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import grpc
from google.rpc import status_pb2

# The request headers a call's code reads as gRPC metadata: credentials, trace context, the asserted caller.
FORWARDED_HEADERS = ("authorization", "traceparent", "tracestate", "x-proctor-caller")
STATUS_DETAILS_KEY = "grpc-status-details-bin"


class HttpAbort(grpc.aio.AbortError):
    """A call ended with a status (the servicer's or the gate's abort), to be answered over HTTP."""

    def __init__(self, code: grpc.StatusCode, message: str, status: status_pb2.Status | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status  # the typed details (field violations, retry delay) when the abort carried them


class HttpCallContext:
    """The ``grpc.aio.ServicerContext`` surface the call's code uses, for one HTTP request."""

    def __init__(self, headers: Mapping[str, str], client: tuple[str, int] | None,
                 timeout_s: float | None = None, client_cert_pem: str | None = None) -> None:
        self._metadata = tuple((name, headers[name]) for name in FORWARDED_HEADERS if name in headers)
        self._peer = f"ipv4:{client[0]}:{client[1]}" if client is not None else ""
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self.params: dict[str, str] = {}  # proto path → body key, where a call's body named a field otherwise
        self.audit_id = ""  # the call's audit id, once its record is open (a stream's header)
        self._auth = {"x509_pem_cert": [client_cert_pem.encode()]} if client_cert_pem else {}

    @classmethod
    def of(cls, request: Any) -> HttpCallContext:
        """The context of a Starlette request: its headers, its peer and its verified client certificate."""
        tls = (request.scope.get("extensions") or {}).get("tls") or {}
        chain = tls.get("client_cert_chain") or []
        return cls(request.headers, request.client, client_cert_pem=chain[0] if chain else None)

    def assert_caller(self, name: str) -> None:
        """Record ``name`` (the body's ``user``) as the caller the client asserts, unless a header did."""
        if all(key != "x-proctor-caller" for key, _ in self._metadata):
            self._metadata = (*self._metadata, ("x-proctor-caller", name))

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        """As gRPC's: the client certificate the TLS handshake verified (``--tls-client-ca``), if any."""
        return self._auth

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def set_trailing_metadata(self, metadata: Any) -> None:
        """Trailers have no HTTP/1.1 counterpart here; what a servicer puts in them is in the body already."""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self._code, self._details = code, details
        raise HttpAbort(code, details)

    async def abort_with_status(self, status: grpc.Status) -> None:
        rich = None
        for key, value in status.trailing_metadata or ():
            if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
                rich = status_pb2.Status.FromString(value)
        self._code, self._details = status.code, status.details
        raise HttpAbort(status.code, status.details, rich)
