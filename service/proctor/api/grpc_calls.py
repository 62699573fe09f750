"""The gRPC door's edge: a ``ServicerContext`` described as a ``CallInfo``, and a domain error sent as a status.

The gate (api/gate.py) admits a call in the server interceptor and publishes its caller in ``CURRENT_IDENTITY``
for the servicers of the same call; ``call_info_of`` reads the context and that variable once, and the call layer
below sees only the ``CallInfo``. ``answering`` is how every servicer ends a call that failed: the domain error is
mapped by the one table (api/failures.py, in gRPC's form by api/errors.py) and the call aborted with it.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import AsyncIterator

import grpc

from proctor.api.call_info import GONE, CallInfo, Identity
from proctor.api.errors import abort_with

CURRENT_IDENTITY: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("proctor_identity", default=None)


def current_identity() -> Identity | None:
    """The authenticated caller of the RPC being served (None in open mode)."""
    return CURRENT_IDENTITY.get()


def call_info_of(context: grpc.aio.ServicerContext) -> CallInfo:
    """The call ``context`` serves, with the caller the gate admitted."""
    remaining = context.time_remaining()
    metadata = {key: value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)}
    certificate = {key: tuple(values) for key, values in (context.auth_context() or {}).items()}
    return CallInfo(peer=context.peer() or "", metadata=metadata, certificate=certificate,
                    deadline=None if remaining is None else time.monotonic() + remaining,
                    identity=current_identity())


@contextlib.asynccontextmanager
async def answering(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    """End the call with the status of any domain error raised within (an abort or a cancel passes as it is)."""
    try:
        yield
    except (grpc.aio.AbortError, *GONE):
        raise
    except Exception as exc:
        await abort_with(context, exc)  # an unexpected error is logged there, once, with its error id
