"""One call as the call layer sees it, whichever door it came through: who, from where, until when.

Each door describes its call once, at its edge: the gRPC door from its ``ServicerContext``
(api/grpc_calls.py), the HTTP door from the request's headers, peer and TLS scope (openai_http/routes.py). What
is read here is what the gate, the audit record and the traces need, and nothing of the transport: the admission
rules (api/admission.py), the call layer (api/generation_service.py) and the audit trail never see a gRPC context
or an HTTP request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from proctor.api.callers import Caller

ASSERTED_CALLER = "x-proctor-caller"  # the header or metadata by which a client names a caller it asserts
# The caller went away: a cancel (client, deadline) or the closing of a stream at a yield. Recorded, never answered.
GONE = (asyncio.CancelledError, GeneratorExit)


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller and how it proved who it is (``token`` or ``tls``)."""

    caller: Caller
    source: str


@dataclass(frozen=True, slots=True)
class CallInfo:
    """A call's transport-free description.

    ``metadata``: the gRPC metadata or HTTP headers the call's code reads (``authorization``, ``traceparent``,
    ``tracestate``, ``x-proctor-caller``), lower-case names; ``certificate``: the client certificate the TLS
    handshake verified, keyed as gRPC's auth context keys it (``x509_pem_cert``, ``x509_common_name``), empty
    without one; ``deadline``: a ``time.monotonic()`` instant (None: none); ``identity``: the caller the gate
    admitted (None in open mode)."""

    peer: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    certificate: Mapping[str, Sequence[bytes]] = field(default_factory=dict)
    deadline: float | None = None
    identity: Identity | None = None

    @property
    def caller(self) -> Caller | None:
        """The authenticated caller, whose limits apply (None in open mode)."""
        return self.identity.caller if self.identity is not None else None

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def trace_metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata as the tracing reads a carrier of it (observability/tracing.py)."""
        return tuple(self.metadata.items())

    def admitted(self, identity: Identity | None) -> CallInfo:
        return replace(self, identity=identity)

    def asserting(self, name: str) -> CallInfo:
        """This call with ``name`` (an HTTP body's ``user``) as the caller the client asserts, unless its headers
        asserted one already (the audit record marks it as asserted, never as authenticated)."""
        if not name or ASSERTED_CALLER in self.metadata:
            return self
        return replace(self, metadata={**self.metadata, ASSERTED_CALLER: name})
