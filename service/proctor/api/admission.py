"""Who calls and what they may do, from a call's description alone: the admission rules both doors apply.

Order per call, so that nothing is spent on a caller before it is admitted: the caller identified from the bearer
token (``authorization: Bearer …``) or the mTLS client certificate (``Unauthenticated`` when neither names a known
caller) → its role checked (``PermissionDenied``) → its rate (``Overloaded`` with the time to wait). Only then
does a door read the request (against the caller's own ``max_request_bytes``: caller_limits.request_bytes_limit)
and, for a generation, take one of the caller's concurrent-generation slots (``generation_slot``). Refusals are
domain errors: each door answers them in its own form (api/failures.py). Nothing here logs or returns a
credential.

The gRPC door runs these rules in its server interceptor (api/gate.py); the HTTP door in its routes, from the
headers, before the body is read (openai_http/routes.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator

from proctor.api.call_info import CallInfo, Identity
from proctor.api.caller_limits import STREAM_RETRY_MS, CallerLimiter
from proctor.api.callers import REFLECTION_PREFIXES, CallerBook, role_for
from proctor.api.tls import peer_certificate
from proctor.domain import Overloaded, PermissionDenied, Unauthenticated

log = logging.getLogger("proctor.auth")


def identify(book: CallerBook, call: CallInfo) -> Identity:
    """The caller a bearer token or client certificate names; ``Unauthenticated`` otherwise."""
    callers = book.current()
    header = call.metadata.get("authorization")
    if header is not None:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the authorization metadata must be 'Bearer <token>'")
        caller = callers.by_token.get(hashlib.sha256(token.strip().encode()).hexdigest())
        if caller is None:
            raise Unauthenticated("unknown bearer token")
        return Identity(caller, "token")
    cert = peer_certificate({key: list(value) for key, value in call.certificate.items()})
    if cert is not None:
        caller = callers.by_subject.get(cert.subject) or next(
            (callers.by_san[san] for san in cert.sans if san in callers.by_san), None)
        if caller is None:
            raise Unauthenticated(f"the client certificate {cert.subject!r} is not a known caller")
        return Identity(caller, "tls")
    raise Unauthenticated("no credentials: send 'authorization: Bearer <token>' metadata or a client certificate")


class Admission:
    """The callers file (None: open mode, every caller let through) and each caller's rate and slots."""

    def __init__(self, book: CallerBook | None) -> None:
        self.book = book
        self.limiter = CallerLimiter()

    def admit(self, method: str, call: CallInfo) -> Identity | None:
        """The caller of a call of ``method`` (the gRPC method, whose role it needs), checked: its identity, its
        role, its rate. None in open mode. Raises Unauthenticated, PermissionDenied or Overloaded."""
        identity = self.identify(method, call)
        if identity is not None:
            self.authorize(method, identity)
        return identity

    def identify(self, method: str, call: CallInfo) -> Identity | None:
        """Who calls (None in open mode); ``Unauthenticated`` (logged) when nothing names a known caller."""
        if self.book is None:
            return None
        try:
            return identify(self.book, call)
        except Unauthenticated as refused:
            log.info("refused %s from %s: %s", method, call.peer, refused)
            raise

    def authorize(self, method: str, identity: Identity) -> None:
        """The caller's role for ``method`` (PermissionDenied), then its rate (Overloaded)."""
        caller = identity.caller
        role = None if method.startswith(REFLECTION_PREFIXES) else role_for(method)  # reflection: any caller
        if role is not None and not caller.may(role):
            raise PermissionDenied(f"caller {caller.name!r} lacks the role {role!r} that {method} needs")
        wait_ms = self.limiter.take_request(caller)
        if wait_ms is not None:
            raise Overloaded(f"caller {caller.name!r} is over its {caller.limits.requests_per_second:g} requests/s",
                             wait_ms)

    @contextlib.contextmanager
    def generation_slot(self, identity: Identity | None) -> Iterator[None]:
        """Hold one of the caller's concurrent-generation slots for the whole call (refused: Overloaded). Taken
        and returned here only, so no path of a call (refused, cancelled, failed) can keep one."""
        if identity is None:
            yield
            return
        caller = identity.caller
        if not self.limiter.open_stream(caller):
            raise Overloaded(f"caller {caller.name!r} already has {caller.limits.concurrent_streams} generations "
                             "running", STREAM_RETRY_MS)
        try:
            yield
        finally:
            self.limiter.close_stream(caller)
