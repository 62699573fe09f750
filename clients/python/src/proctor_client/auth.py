"""Credentials for a Proctor server: TLS / mutual TLS channel credentials and a bearer token.

The token travels as ``authorization: Bearer <token>`` metadata on every call. It is added by a
channel interceptor rather than gRPC call credentials, which gRPC refuses on plaintext channels
(a loopback server without TLS still checks tokens).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import grpc.aio

TOKEN_ENV = "PROCTOR_TOKEN"


def tls_credentials(ca_file: str | Path | None = None, cert_file: str | Path | None = None,
                    key_file: str | Path | None = None) -> grpc.ChannelCredentials:
    """TLS trusting ``ca_file`` (None: the system roots); with cert and key, a client certificate (mTLS)."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("a client certificate needs both cert_file and key_file")
    return grpc.ssl_channel_credentials(root_certificates=_read(ca_file), private_key=_read(key_file),
                                        certificate_chain=_read(cert_file))


def _read(path: str | Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def resolve_token(token: str | None = None, token_file: str | Path | None = None) -> str | None:
    """The token given, else read from ``token_file``, else ``$PROCTOR_TOKEN``, else None."""
    if token:
        return token
    if token_file:
        return Path(token_file).read_text(encoding="utf-8").strip() or None
    return os.environ.get(TOKEN_ENV) or None


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Sequence[tuple[str, str]] | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: Any


def _with_token(details: Any, header: tuple[str, str]) -> Any:
    metadata = [*(details.metadata or ()), header]
    fields = {name: getattr(details, name, None) for name in _Details._fields}
    fields["metadata"] = metadata
    return _Details(**fields)


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the token to every call of a sync channel."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_token(details, self._header), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_token(details, self._header), request)


class AsyncBearerToken(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """Adds the token to every call of a ``grpc.aio`` channel."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_aio_token(details, self._header), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_aio_token(details, self._header), request)


def _with_aio_token(details: grpc.aio.ClientCallDetails, header: tuple[str, str]) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add(*header)
    return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                      details.wait_for_ready)
