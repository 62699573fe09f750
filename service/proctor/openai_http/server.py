"""The HTTP listener: uvicorn in the gRPC server's own event loop, TLS from the same files, re-read on change.

Why Starlette on uvicorn (not FastAPI): the body is checked by our own table (openai_http/fields.py and
body.py), which must answer in OpenAI's error object with ``param``, so FastAPI's pydantic validation (422
answers) would be a second, contradicting layer on every request; Starlette is the routing and streaming
FastAPI itself runs on. uvicorn with httptools parses HTTP/1.1 in C. Measured: bench/README.md, "HTTP".

Signals stay the gRPC server's (app.py): uvicorn's own handlers are not installed, and ``stop`` closes the
listener and gives calls in flight the same grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proctor.api.admission import Admission
from proctor.api.generation_service import GenerationService
from proctor.api.observer import CallObserver
from proctor.api.readiness import Serving
from proctor.api.tls import CertificateFiles
from proctor.audit.store import AuditStore
from proctor.audit.tlog_read import TlogReader
from proctor.config import Settings
from proctor.openai_http.routes import HttpDoor

log = logging.getLogger("proctor.http")
TLS_CHECK_S = 1.0


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT belong to the gRPC server's shutdown (app.py), which stops this one too."""
        yield


class _TlsScopeProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol that also puts the verified client certificate in the scope, as the ASGI TLS
    extension spells it (``scope["extensions"]["tls"]["client_cert_chain"]``: PEM), so the admission rules map it
    to a caller exactly as they do a gRPC call's (api/admission.py)."""

    client_pem: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        self.client_pem = ssl.DER_cert_to_PEM_cert(der) if der else None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.client_pem is not None:
            self.scope["extensions"] = {"tls": {"client_cert_chain": [self.client_pem]}}


class HttpListener:
    """One HTTP(S) port serving ``app``; ``start`` binds it (port 0: a free one), ``stop`` drains it."""

    def __init__(self, app: Starlette, settings: Settings) -> None:
        self.settings = settings
        self.config = uvicorn.Config(app, host=settings.host, port=settings.http_port, log_config=None,
                                     http=_TlsScopeProtocol,
                                     access_log=False, lifespan="off", server_header=False,
                                     timeout_graceful_shutdown=max(1, round(settings.grace_period_s)))
        self.server = _Server(self.config)
        self.port = 0
        self._task: asyncio.Task[None] | None = None
        self._tls_watch: asyncio.Task[None] | None = None

    async def start(self) -> int:
        self.config.load()
        files = None
        if self.settings.tls_cert_file and not self.settings.http_plaintext:
            files, self.config.ssl = _tls_context(self.settings)
        elif self.settings.http_plaintext and not self.settings.loopback:
            log.warning("--http-plaintext: the HTTP port on %s has no TLS (a gateway or mesh must provide it)",
                        self.settings.host)
        family = socket.AF_INET6 if ":" in self.settings.host.strip("[]") else socket.AF_INET
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto says TCP, and
        # without it every keep-alive request's first chunk waits out the client's delayed ACK (~40 ms)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.settings.host.strip("[]"), self.settings.http_port))
        except OSError as exc:
            sock.close()
            raise OSError(f"could not bind the HTTP port {self.settings.host}:{self.settings.http_port}: {exc}") \
                from exc
        sock.set_inheritable(True)
        self.port = sock.getsockname()[1]
        self._task = asyncio.create_task(self.server._serve(sockets=[sock]), name="proctor-http")
        while not self.server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise OSError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)
        if files is not None and self.config.ssl is not None:
            self._tls_watch = asyncio.create_task(_watch_tls(files, self.config.ssl), name="proctor-http-tls")
        log.info("OpenAI-compatible HTTP API on %s://%s:%d", "https" if files else "http", self.settings.host,
                 self.port)
        return self.port

    async def stop(self) -> None:
        """Stop accepting, then wait for the requests in flight (uvicorn's graceful timeout: the grace period)."""
        if self._tls_watch is not None:
            self._tls_watch.cancel()
        if self._task is None:
            return
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _tls_context(settings: Settings) -> tuple[CertificateFiles, ssl.SSLContext]:
    """The server's TLS context from the gRPC port's certificate files (client certificates required with a CA)."""
    client_ca = Path(settings.tls_client_ca_file) if settings.tls_client_ca_file else None
    files = CertificateFiles(Path(settings.tls_cert_file), Path(settings.tls_key_file), client_ca)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return files, context


async def _watch_tls(files: CertificateFiles, context: ssl.SSLContext) -> None:
    """Serve a rotated certificate to the next connection; a half-written rotation keeps the previous one."""
    while True:
        await asyncio.sleep(TLS_CHECK_S)
        if files.fetch() is None:
            continue
        try:
            context.load_cert_chain(files.cert, files.key)
            if files.client_ca is not None:
                context.load_verify_locations(files.client_ca)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS files changed but cannot be used over HTTP (%s); serving the previous certificate", exc)


async def serve_http(settings: Settings, service: GenerationService, admission: Admission,
                     observer: CallObserver, serving: Serving, audit_store: AuditStore | None = None
                     ) -> HttpListener | None:
    """Start the OpenAI-compatible HTTP API on ``settings.http_port`` (None when it is 0: no HTTP API) over the gRPC
    server's own parts: its call layer, admission rules (callers, rates, slots), call observer (metrics, traces,
    log) and health; and the audit log (``audit_store``) as a tiled log under /tlog/."""
    if not settings.http_port:
        return None
    tlog = TlogReader(audit_store, public=settings.tlog_public) if audit_store is not None else None
    listener = HttpListener(HttpDoor(settings, service, admission, observer, serving, tlog).app(), settings)
    await listener.start()
    return listener
