"""Retention: the keys of records past ``--audit-retention-days`` destroyed (EU AI Act Art. 19 and 26(6): keep the
logs at least six months; GDPR: no longer than needed).

A key seals one subject's records of one UTC day (audit/keystore.py), so a sweep at ``now`` destroys the keys of
the days wholly before ``now - days`` that no hold in force covers (audit/holds.py), and appends one erasure record
naming them. The rows stay: the chain, the tree and every proof are intact; their content reads as erased. The
server sweeps every ``SWEEP_INTERVAL_S`` while retention is on; ``proctor audit sweep`` runs one (a CronJob:
deploy/kubernetes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from proctor.audit.erasure import Erased, destroy
from proctor.audit.holds import DAY_MS, active_holds, day_of
from proctor.audit.keystore import KeyStore
from proctor.audit.sink import AuditSink
from proctor.audit.store import AuditStore

log = logging.getLogger("proctor.audit")
SWEEP_INTERVAL_S = 3600.0


def expired_day(now_ms: int, days: int) -> str:
    """The last UTC day past retention at ``now_ms``: its records are all older than ``days`` days."""
    return day_of(now_ms - days * DAY_MS - DAY_MS)


def sweep(store: AuditStore, keys: KeyStore, days: int, now_ms: int, operator: str,
          append: Callable[[dict[str, Any]], str]) -> Erased:
    """Destroy the keys past ``days`` of retention at ``now_ms`` that no hold covers; one erasure record for them
    (none when nothing is due)."""
    if days <= 0:
        raise ValueError("retention is off (--audit-retention-days 0): nothing to sweep")
    last = expired_day(now_ms, days)
    due = [entry for entry in keys.entries() if entry.day <= last]
    holds = active_holds(store)
    held = [entry for entry in due if any(hold.covers(entry) for hold in holds)]
    free = [entry for entry in due if entry not in held]
    kept = tuple(sorted(entry.key_id for entry in held))
    if not free:
        return Erased((), 0, kept, "")
    return destroy(store, keys, free, {"subject": None, "reason": f"retention: {days} days (records of {last} and "
                                                                  "before)"}, operator, append, held=kept)


class RetentionSweeper:
    """The server's own sweep: one at start and every ``SWEEP_INTERVAL_S`` (``--audit-retention-days``), off the
    event loop, its erasure record through the server's writer."""

    def __init__(self, sink: AuditSink, keys: KeyStore, days: int) -> None:
        self._sink, self._keys, self._days = sink, keys, days
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="proctor-retention")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            try:
                done = await asyncio.to_thread(sweep, self._sink.store, self._keys, self._days,
                                               int(time.time() * 1000), "proctor serve (retention)", self._append)
                if done.key_ids or done.held:
                    log.info("retention sweep: %d keys destroyed (%d records), %d kept by holds",
                             len(done.key_ids), done.records, len(done.held))
            except Exception:  # the next sweep tries again; the records stay readable meanwhile
                log.exception("retention sweep failed")
            await asyncio.sleep(SWEEP_INTERVAL_S)

    def _append(self, body: dict[str, Any]) -> str:
        self._sink.submit(body).result(timeout=60)
        return str(body["audit_id"])
