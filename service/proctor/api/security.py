"""Safe by default: what a server may expose, its gate, and its (TLS or plaintext) port.

On loopback without a callers file the server is open and says so; on any other address it
refuses to start without TLS and a callers file unless ``insecure`` is set explicitly.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc

from proctor.api.callers import CallerBook
from proctor.api.gate import ServerGate
from proctor.api.tls import CertificateFiles, server_credentials
from proctor.config import Settings

log = logging.getLogger("proctor.auth")


class ExposureRefused(ValueError):
    """The settings would put an unauthenticated or plaintext server on the network."""


def exposure_problem(settings: Settings) -> str:
    """Why these settings may not start (empty when they may)."""
    if settings.loopback or settings.insecure:
        return ""
    missing = [what for what, ok in (("TLS (--tls-cert/--tls-key)", settings.tls_cert_file),
                                      ("a callers file (--callers-file)", settings.callers_file)) if not ok]
    if not missing:
        return ""
    return (f"refusing to serve on {settings.host} without {' and '.join(missing)}: anyone on the network could "
            f"call it; pass --insecure to do it anyway")


def build_gate(settings: Settings) -> ServerGate:
    """The interceptor, with the callers file loaded now (a bad file stops the start)."""
    problem = exposure_problem(settings)
    if problem:
        raise ExposureRefused(problem)
    book = CallerBook(Path(settings.callers_file)) if settings.callers_file else None
    if book is None:
        log.warning("no callers file: every caller that can reach %s may call every RPC (open mode)", settings.host)
    else:
        log.info("callers file %s: %d callers", book.path, len(book.current()))
    if settings.insecure and not settings.loopback:
        log.warning("--insecure: serving on %s%s", settings.host,
                    "" if settings.tls_cert_file else " in plaintext (tokens and outputs readable on the network)")
    return ServerGate(book, reflection_needs_auth=settings.reflection_needs_auth,
                      max_request_bytes=settings.max_message_bytes)


def bind(server: grpc.aio.Server, settings: Settings) -> tuple[int, CertificateFiles | None]:
    """Add the port (TLS when a certificate is configured); the bound port and the watched certificate files."""
    address = f"{settings.host}:{settings.port}"
    secure = server_credentials(settings)
    if secure is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, secure[0])
        log.info("TLS on %s (%s)", address, "mutual: client certificates required" if settings.tls_client_ca_file
                 else "server certificate only")
    if port == 0:
        raise OSError(f"could not bind {address}")
    return port, None if secure is None else secure[1]
