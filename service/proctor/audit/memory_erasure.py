"""Erasure reaches the server's memory: a subject's prompts leave the prefix cache once its keys are destroyed.

``proctor audit erase`` (or the retention sweep) destroys keys in the key store, often from another process, and
tells no server. Each server with ``--audit-encryption subject`` therefore reads the store's live keys every
``POLL_S`` and drops the cached prompt chunks of every subject that has none left (engine/prefix_cache.py
``forget``). A chunk stored in the last ``GRACE_S`` is kept for now: a subject's first prompt is cached before its
first record makes its key. So within ``POLL_S + GRACE_S`` of an erasure nothing of the subject's prompts is left
in the server's memory but what calls still running hold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from proctor.audit.keystore import KeyStore
from proctor.audit.periodic import Periodic

log = logging.getLogger("proctor.audit")
POLL_S = 2.0
GRACE_S = 30.0
REACH_S = POLL_S + GRACE_S  # at most this long after an erasure (said by `proctor audit erase`)

Forget = Callable[[Collection[str], float], int]  # (live subjects, stored before) -> chunks dropped


def forget_erased(keys: KeyStore, forget: Forget, now: float | None = None) -> int:
    """Drop what ``forget`` holds of subjects with no live key in ``keys``; how many chunks were dropped."""
    live = {entry.subject for entry in keys.entries()}
    return forget(live, (time.monotonic() if now is None else now) - GRACE_S)


def memory_erasure(keys: KeyStore, forget: Forget) -> Periodic:
    """The server's watcher (app.py starts it with the engine's prefix cache when subject encryption is on)."""

    def poll() -> None:
        dropped = forget_erased(keys, forget)
        if dropped:
            log.info("erasure: %d prefix-cache chunks of subjects with no live key dropped", dropped)

    return Periodic("memory-erasure", POLL_S, poll)
