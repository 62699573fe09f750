"""Pieces the sync and asyncio clients share: channel options, deadlines, the retry policy, request coercion."""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from proctor_client._version import __version__
from proctor_client.request import build_request
from proctor_client.v1 import generation_pb2

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
READY_POLL_S = 0.25
ChannelOptions = Sequence[tuple[str, Any]]


class _Unset(enum.Enum):
    """Marks "use the client's default" where None already means "no deadline"."""

    UNSET = enum.auto()


UNSET = _Unset.UNSET
TimeoutArg = float | None | _Unset


def channel_options(options: ChannelOptions | None) -> list[tuple[str, Any]]:
    """Defaults (16 MiB messages, quick reconnects for readiness polling), overridden by the caller's options."""
    merged: dict[str, Any] = {
        "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
        "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
        "grpc.max_reconnect_backoff_ms": 2000,
        "grpc.primary_user_agent": f"proctor-client/{__version__}",
    }
    merged.update(options or ())
    return list(merged.items())


def resolve_timeout(timeout_s: TimeoutArg, default: float | None) -> float | None:
    """Per-call timeout: UNSET takes the client default, None disables the deadline."""
    return default if timeout_s is UNSET else timeout_s


class Deadline:
    """One deadline across all attempts of a call, so retries never extend the caller's timeout."""

    def __init__(self, timeout_s: float | None) -> None:
        self._end = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining(self) -> float | None:
        """Seconds left (never negative), or None without a deadline."""
        return None if self._end is None else max(0.0, self._end - time.monotonic())


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, for UNAVAILABLE only: the one code that means "nothing happened"."""

    retries: int = 3
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("retries and backoff must not be negative")

    def delay(self, code: grpc.StatusCode | None, attempt: int, remaining_s: float | None) -> float | None:
        """Seconds to sleep before retry number ``attempt + 1``, or None when the error is final."""
        if code != grpc.StatusCode.UNAVAILABLE or attempt >= self.retries:
            return None
        base = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        delay = base / 2 + random.uniform(0.0, base / 2)
        if remaining_s is not None and delay >= remaining_s:
            return None
        return delay


def coerce_request(
    request: generation_pb2.GenerateRequest | str | None, kwargs: Mapping[str, Any]
) -> generation_pb2.GenerateRequest:
    """Take a prebuilt request as is, or build one from a prompt / ``messages=`` and build_request's kwargs."""
    if isinstance(request, generation_pb2.GenerateRequest):
        if kwargs:
            raise TypeError(f"a prebuilt GenerateRequest takes no further arguments, got {sorted(kwargs)}")
        return request
    return build_request(request, **kwargs)


def status_code(error: grpc.RpcError) -> grpc.StatusCode | None:
    """The status code of a sync or asyncio RpcError (None for a bare RpcError)."""
    code = getattr(error, "code", None)
    return code() if callable(code) else None
