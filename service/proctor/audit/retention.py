"""Retention: the keys of records past ``--audit-retention-days`` destroyed (EU AI Act Art. 19 and 26(6): keep the
logs at least six months; GDPR: no longer than needed).

A key seals one subject's records of one UTC day (audit/keystore.py), so a sweep at ``now`` destroys the keys of
the days wholly before ``now - days`` that no hold in force covers (audit/holds.py), and appends one erasure record
naming them. ``days`` is a ``RetentionPolicy``'s: a period per subject, else per caller (a key sealing several
callers' records keeps the longest of theirs), else ``--audit-retention-days``; ``--audit-retention-file`` names
the periods (YAML: ``subjects: {customer-17: 30}``, ``callers: {billing: 2555}``; 0 keeps for ever). A sweep first
walks the key files (``KeyStore.recover``), so a key the store's index lost is swept (or held) like the others.

The rows stay: the chain, the tree and every proof are intact; their content reads as erased. The server sweeps
every ``SWEEP_INTERVAL_S`` while retention is on; ``proctor audit sweep`` runs one (a CronJob:
deploy/k8s/components/retention).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from proctor.audit.erasure import Erased, described_by_records, destroy, recovered_note
from proctor.audit.holds import DAY_MS, active_holds, day_of
from proctor.audit.keystore import KeyEntry, KeyStore
from proctor.audit.periodic import Periodic
from proctor.audit.sink import AuditSink
from proctor.audit.store import AuditStore

log = logging.getLogger("proctor.audit")
SWEEP_INTERVAL_S = 3600.0


@dataclass(frozen=True)
class RetentionPolicy:
    """Days a record's content is kept: by subject, else by caller, else ``default`` (0: for ever)."""

    default: int
    callers: dict[str, int] = field(default_factory=dict)
    subjects: dict[str, int] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        return any((self.default, *self.callers.values(), *self.subjects.values()))

    def days(self, entry: KeyEntry) -> int:
        """The period of a key's records (0: kept)."""
        if entry.subject in self.subjects:
            return self.subjects[entry.subject]
        periods = [self.callers.get(caller, self.default) for caller in entry.callers]
        return 0 if 0 in periods else max(periods, default=self.default)

    @classmethod
    def load(cls, default: int, path: str) -> RetentionPolicy:
        """``default`` days, with the file at ``path`` (YAML ``callers`` and ``subjects`` maps; "": none)."""
        if not path:
            return cls(default)
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        maps = {name: data.get(name) or {} for name in ("callers", "subjects")}
        for name, periods in maps.items():
            if not isinstance(periods, dict) or not all(isinstance(days, int) and days >= 0
                                                        for days in periods.values()):
                raise ValueError(f"{path}: {name} maps names to whole days >= 0 (0: kept for ever)")
        return cls(default, {str(k): v for k, v in maps["callers"].items()},
                   {str(k): v for k, v in maps["subjects"].items()})


def expired_day(now_ms: int, days: int) -> str:
    """The last UTC day past retention at ``now_ms``: its records are all older than ``days`` days."""
    return day_of(now_ms - days * DAY_MS - DAY_MS)


def sweep(store: AuditStore, keys: KeyStore, policy: RetentionPolicy, now_ms: int, operator: str,
          append: Callable[[dict[str, Any]], str]) -> Erased:
    """Destroy the keys past their retention at ``now_ms`` that no hold covers; one erasure record for them (none
    when nothing is due)."""
    if not policy.on:
        raise ValueError("retention is off (--audit-retention-days 0 and no period in a retention file)")
    recovered = keys.recover(described_by_records(store, keys))  # a key the index lost is due all the same
    due = [entry for entry in keys.entries()
           if (days := policy.days(entry)) > 0 and entry.day <= expired_day(now_ms, days)]
    holds = active_holds(store)
    held = [entry for entry in due if any(hold.covers(entry) for hold in holds)]
    free = [entry for entry in due if entry not in held]
    kept = tuple(sorted(entry.key_id for entry in held))
    if not free:
        return Erased((), 0, kept, "", recovered)
    periods = sorted({policy.days(entry) for entry in free})
    done = destroy(store, keys, free, {"subject": None, "reason": f"retention: {', '.join(map(str, periods))} days"},
                   operator, append, held=kept)
    return replace(done, recovered=recovered)


def retention_sweeper(sink: AuditSink, keys: KeyStore, policy: RetentionPolicy) -> Periodic:
    """The server's own sweep: one at start and every ``SWEEP_INTERVAL_S`` (``--audit-retention-days``), off the
    event loop, its erasure record through the server's writer (a failed sweep is logged; the next tries again, and
    the records stay readable meanwhile)."""

    def append(body: dict[str, Any]) -> str:
        sink.submit(body).result(timeout=60)
        return str(body["audit_id"])

    def run() -> None:
        done = sweep(sink.store, keys, policy, int(time.time() * 1000), "proctor serve (retention)", append)
        if done.key_ids or done.held or done.recovered.entries or done.recovered.unattributed:
            log.info("retention sweep: %d keys destroyed (%d records), %d kept by holds%s",
                     len(done.key_ids), done.records, len(done.held), recovered_note(done.recovered))

    return Periodic("retention sweep", SWEEP_INTERVAL_S, run)
