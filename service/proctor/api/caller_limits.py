"""Per-caller limits: requests per second with a burst (a token bucket), concurrent generations, a token cap.

Used only on the event loop, so no locks. A refusal says how long to wait: the time until the
bucket holds a whole token again, or a short fixed pause for a full set of streams.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from proctor.api.callers import Caller
from proctor.config import Settings
from proctor.domain.output_budget import OutputLimits

STREAM_RETRY_MS = 250


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


class CallerLimiter:
    def __init__(self) -> None:
        self._buckets: dict[str, _Bucket] = {}
        self._streams: dict[str, int] = {}

    def take_request(self, caller: Caller) -> int | None:
        """Spend one request; None when allowed, else milliseconds until one is."""
        rate = caller.limits.requests_per_second
        if rate is None:
            return None
        capacity = float(caller.limits.burst or max(1, math.ceil(rate)))
        now = time.monotonic()
        bucket = self._buckets.get(caller.name)
        if bucket is None:
            bucket = self._buckets[caller.name] = _Bucket(capacity, now)
        bucket.tokens = min(capacity, bucket.tokens + (now - bucket.stamp) * rate)
        bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return max(1, math.ceil((1.0 - bucket.tokens) / rate * 1000))

    def open_stream(self, caller: Caller) -> bool:
        """Take a concurrent-generation slot; False when the caller already holds its limit."""
        limit = caller.limits.concurrent_streams
        held = self._streams.get(caller.name, 0)
        if limit is not None and held >= limit:
            return False
        self._streams[caller.name] = held + 1
        return True

    def open_streams(self) -> dict[str, int]:
        """Concurrent-generation slots held now, by caller (a copy: read by the metrics scrape)."""
        return dict(self._streams)

    def close_stream(self, caller: Caller) -> None:
        held = self._streams.get(caller.name, 0) - 1
        if held > 0:
            self._streams[caller.name] = held
        else:
            self._streams.pop(caller.name, None)


def request_bytes_limit(caller: Caller | None, server_limit: int | None) -> int | None:
    """The bytes a request of ``caller`` may have (None: an open server's caller; a None answer: no limit): its
    own limit, never above the server's. Both doors ask, after the caller is admitted and before its request is
    read or decoded."""
    own = caller.limits.max_request_bytes if caller is not None else None
    if own is None or server_limit is None:
        return server_limit if own is None else own
    return min(own, server_limit)


def output_limits(settings: Settings, caller: Caller | None) -> OutputLimits:
    """What bounds a request's output on this server for ``caller`` (None: open mode, no cap of its own); the
    request's budget is resolved from it once (domain/output_budget.py)."""
    return OutputLimits(settings.default_max_new_tokens, settings.max_new_tokens_limit,
                        caller.limits.max_new_tokens if caller is not None else None,
                        caller.name if caller is not None else "")
