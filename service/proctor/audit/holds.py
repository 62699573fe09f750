"""Legal holds: what erasure and retention must leave alone until released (SEC 17a-4, litigation holds).

A hold covers a subject, a caller, or a time range of records; it is a ``hold`` record in the log, and its end a
``release`` record naming it, so who held what, when and why is itself evidence. The holds in force are read
from the log (``active_holds``); a key (audit/keystore.py: one subject's records of one UTC day, by the callers
it lists) is covered when its subject, one of its callers, or its day falls under a hold in force.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from proctor.audit import FORMAT
from proctor.audit.keystore import KeyEntry
from proctor.audit.kinds import HOLD, RELEASE
from proctor.audit.store import AuditStore, Filters

DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class Hold:
    hold_id: str
    scope: dict[str, Any]  # {"subject": S} | {"caller": C} | {"from_ms": A, "to_ms": B}
    reason: str
    placed_by: str
    time_ms: int

    def covers(self, entry: KeyEntry) -> bool:
        scope = self.scope
        if "subject" in scope:
            return bool(entry.subject == scope["subject"])
        if "caller" in scope:
            return bool(scope["caller"] in entry.callers)
        start = int(datetime.fromisoformat(entry.day).replace(tzinfo=UTC).timestamp() * 1000)
        return start < int(scope["to_ms"]) and int(scope["from_ms"]) < start + DAY_MS

    def describe(self) -> str:
        return (f"hold {self.hold_id} on {_scope_text(self.scope)} ({self.reason!r}, placed by {self.placed_by} at "
                f"{datetime.fromtimestamp(self.time_ms / 1000, tz=UTC).isoformat(timespec='seconds')})")


class Held(PermissionError):
    """What was asked is covered by a hold in force."""

    def __init__(self, hold: Hold, what: str) -> None:
        super().__init__(f"{what} is under {hold.describe()}: release it first (proctor audit release {hold.hold_id})")
        self.hold = hold


def active_holds(store: AuditStore) -> list[Hold]:
    """The holds placed and not released, oldest first."""
    released = {json.loads(row.record_json()).get("hold_id") for row in store.iterate(Filters(kind=RELEASE))}
    holds = []
    for row in store.iterate(Filters(kind=HOLD)):
        body = json.loads(row.record_json())
        if body["audit_id"] not in released:
            holds.append(Hold(body["audit_id"], body["scope"], body["reason"], body["caller"]["identity"],
                              body["time_ms"]))
    return holds


def hold_body(scope: dict[str, Any], reason: str, operator: str, now_ms: int | None = None) -> dict[str, Any]:
    """A new hold's record (its audit id is the hold's id)."""
    if len(scope) != 1 and set(scope) != {"from_ms", "to_ms"}:
        raise ValueError("a hold covers one subject, one caller, or one time range (from and to)")
    if "from_ms" in scope and not int(scope["from_ms"]) < int(scope["to_ms"]):
        raise ValueError("a hold's time range ends after it starts")
    return {"format": FORMAT, "kind": HOLD, "audit_id": f"hold-{secrets.token_hex(8)}",
            "time_ms": now_ms if now_ms is not None else int(time.time() * 1000),
            "caller": {"identity": operator, "source": "proctor audit hold"}, "scope": scope, "reason": reason}


def release(store: AuditStore, hold_id: str, reason: str, operator: str,
            append: Callable[[dict[str, Any]], str]) -> Hold:
    """End hold ``hold_id`` with a release record; the hold it ended."""
    hold = next((hold for hold in active_holds(store) if hold.hold_id == hold_id), None)
    if hold is None:
        raise LookupError(f"no hold {hold_id!r} in force (never placed, or released already)")
    append({"format": FORMAT, "kind": RELEASE, "audit_id": f"release-{secrets.token_hex(8)}",
            "time_ms": int(time.time() * 1000), "caller": {"identity": operator, "source": "proctor audit release"},
            "hold_id": hold_id, "reason": reason})
    return hold


def day_of(time_ms: int) -> str:
    """The UTC day (ISO 8601) of a time in milliseconds: what a key's ``day`` is."""
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=time_ms)).date().isoformat()


def _scope_text(scope: dict[str, Any]) -> str:
    if "subject" in scope:
        return f"subject {scope['subject']!r}"
    if "caller" in scope:
        return f"caller {scope['caller']!r}"
    return f"records from {scope['from_ms']} to {scope['to_ms']} ms"
