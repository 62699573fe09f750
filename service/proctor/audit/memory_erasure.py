"""Erasure reaches the server's memory: a subject's prompts leave the prefix cache once its keys are destroyed.

``proctor audit erase`` (or the retention sweep) destroys keys in the key store, often from another process, and
tells no server. Each server with ``--audit-encryption subject`` therefore reads the store's live keys every
``POLL_S`` and drops the cached prompt chunks (engine/prefix_cache.py ``forget``) of every subject that had a key
at the last reading and has none now: within ``POLL_S`` of an erasure. A subject the server never saw with a key
(one made and destroyed between two readings, or a call whose record was never sealed) loses its chunks once they
are ``GRACE_S`` old: a subject's first prompt is cached before its first record makes its key, so a younger chunk
of a subject without a key is not yet a sign of erasure. What calls still running hold stays until they end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from proctor.audit.keystore import KeyStore
from proctor.audit.periodic import Periodic

log = logging.getLogger("proctor.audit")
POLL_S = 2.0
GRACE_S = 30.0

Erased = Callable[[str, float], bool]  # (a chunk's subject, when it was stored) -> drop it
Forget = Callable[[Erased], int]  # drop the chunks ``Erased`` names; how many


class MemoryErasure:
    """What the server last read of the key store; ``poll`` reads it again and drops what an erasure left."""

    def __init__(self, keys: KeyStore, forget: Forget) -> None:
        self._keys, self._forget = keys, forget
        self._live: set[str] = set()

    def poll(self, now: float | None = None) -> int:
        """Drop the chunks of subjects whose keys are gone; how many chunks were dropped."""
        live = {entry.subject for entry in self._keys.entries()}
        lost, self._live = self._live - live, live
        cutoff = (time.monotonic() if now is None else now) - GRACE_S
        return self._forget(lambda subject, stored_at: subject in lost or (subject not in live and stored_at < cutoff))


def memory_erasure(keys: KeyStore, forget: Forget) -> Periodic:
    """The server's watcher (app.py starts it with the engine's prefix cache when subject encryption is on)."""
    watcher = MemoryErasure(keys, forget)

    def poll() -> None:
        dropped = watcher.poll()
        if dropped:
            log.info("erasure: %d prefix-cache chunks of subjects with no live key dropped", dropped)

    return Periodic("memory-erasure", POLL_S, poll)
