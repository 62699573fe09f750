"""Erasure by crypto-shredding: destroy a subject's key and record that it was done (GDPR Art. 17).

``erase`` counts the records sealed under the subject's key (audit/sealing.py), destroys the key
(audit/keystore.py), and appends an ``erasure`` record: who, when, which subject, which key, how many records and
why. Nothing in the log changes: every row, the chain, the Merkle tree, every checkpoint and every proof handed out
stay valid, and the erased content can no longer be read by anyone, with the database or without.

Readers go through ``opened_json``: a sealed record comes back opened, or, its key destroyed, marked ``erased``;
``erased_problem`` is why a replay of one is refused (naming the erasure record).

``erase`` and the retention sweep first have the key store walk its keys (``KeyStore.recover``), so a key its
index lost (two processes writing it before it was locked, audit/keystore.py) is found, put back and destroyed
with the others; ``described_by_records`` names the subject of such a key that carries no entry (an older
version's) from the records it sealed.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proctor.audit import FORMAT
from proctor.audit.canonical import canonical
from proctor.audit.holds import Held, active_holds, day_of
from proctor.audit.keystore import Describe, KeyEntry, KeyStore, Recovered
from proctor.audit.kinds import ERASURE
from proctor.audit.records import recorded_subject
from proctor.audit.sealing import SealError, open_body, sealed_key_id
from proctor.audit.store import AuditStore, Filters, Row


class NothingToErase(LookupError):
    """The subject has no live key here (never recorded under encryption, or erased already)."""


@dataclass(frozen=True, slots=True)
class Erased:
    key_ids: tuple[str, ...]
    records: int
    held: tuple[str, ...]  # keys a hold kept (the sweep)
    audit_id: str  # the erasure record's ("" when nothing was destroyed)
    recovered: Recovered = field(default_factory=Recovered)  # keys found outside the index first (any subject's)


def opened_json(row: Row, keys: KeyStore | None) -> str:
    """The row's record as JSON: as stored, or, sealed, opened (its key live) or marked erased."""
    stored = row.record_json()
    if b'"sealed":' not in stored:
        return stored.decode("utf-8")
    return canonical(open_body(json.loads(stored), keys)).decode("utf-8")


def erased_problem(body: dict[str, Any], store: AuditStore) -> str:
    """Why an opened record cannot be replayed because it was erased ("" when it was not)."""
    erased = body.get("erased")
    if not erased:
        return ""
    found = erasure_of(store, str(erased.get("key_id")))
    when = f" by erasure record {found['audit_id']} ({found['reason']!r})" if found else ""
    return f"the record's content was erased{when}: its subject's key is destroyed, so there is nothing to replay"


def erasure_of(store: AuditStore, key_id: str) -> dict[str, Any] | None:
    """The erasure record that destroyed ``key_id`` (None: none found)."""
    for row in store.iterate(Filters(kind=ERASURE)):
        body = json.loads(row.record_json())
        if key_id in body.get("key_ids", ()):
            return dict(body)
    return None


def erase(store: AuditStore, keys: KeyStore, subject: str, reason: str, operator: str,
          append: Callable[[dict[str, Any]], str], progress: Callable[[int], None] | None = None) -> Erased:
    """Destroy every key of ``subject`` and append the erasure record with ``append`` (which returns its audit id).
    ``Held`` (naming the hold) when a hold in force covers any of them: nothing is destroyed then."""
    recovered = keys.recover(described_by_records(store, keys))
    entries = [entry for entry in keys.entries() if entry.subject == subject]
    if not entries:
        raise NothingToErase(f"subject {subject!r} has no key here: none of its records is sealed, or it was "
                             "erased already" + recovered_note(recovered, subject))
    holds = active_holds(store)
    for entry in entries:
        for hold in holds:
            if hold.covers(entry):
                raise Held(hold, f"subject {subject!r}")
    done = destroy(store, keys, entries, {"subject": subject, "reason": reason}, operator, append, progress)
    return replace(done, recovered=recovered)


def destroy(store: AuditStore, keys: KeyStore, entries: list[KeyEntry], about: dict[str, Any], operator: str,
            append: Callable[[dict[str, Any]], str], progress: Callable[[int], None] | None = None,
            held: tuple[str, ...] = ()) -> Erased:
    """Destroy the keys of ``entries`` and append one erasure record (``about``: its subject and reason): the keys,
    the subjects and days they sealed, and how many records they sealed."""
    wanted = {entry.key_id for entry in entries}
    count = 0
    for row in store.iterate(Filters()):
        if b'"sealed":' in (stored := row.record_json()) and sealed_key_id(json.loads(stored)) in wanted:
            count += 1
        if progress is not None:
            progress(1)
    for entry in entries:
        keys.destroy(entry.key_id)
    body = {"format": FORMAT, "kind": ERASURE, "audit_id": f"erasure-{secrets.token_hex(8)}",
            "time_ms": int(time.time() * 1000), "caller": {"identity": operator, "source": "proctor audit"}, **about,
            "key_ids": sorted(wanted), "keys": [{"subject": e.subject, "day": e.day} for e in entries],
            "records": count}
    return Erased(tuple(sorted(wanted)), count, held, append(body))


def described_by_records(store: AuditStore, keys: KeyStore) -> Describe:
    """``KeyStore.recover``'s ``describe``: a key's subject, day and callers from the records it sealed (the
    subject as the record names it: records.recorded_subject), one opened with the key
    itself; a key that sealed no record, or none that opens, is not described."""

    def describe(key_ids: Sequence[str]) -> dict[str, KeyEntry]:
        wanted = set(key_ids)
        first: dict[str, tuple[dict[str, Any], int]] = {}
        callers: dict[str, set[str]] = {}
        for row in store.iterate(Filters()):
            if b'"sealed":' not in (stored := row.record_json()):
                continue
            body = json.loads(stored)
            if (key_id := sealed_key_id(body)) in wanted and key_id is not None:
                first.setdefault(key_id, (body, row.time_ms))
                callers.setdefault(key_id, set()).add(str((body.get("caller") or {}).get("identity", "")))
        described = {}
        for key_id, (body, time_ms) in first.items():
            try:
                opened = open_body(body, keys)
            except SealError:
                continue
            if opened.get("erased"):
                continue
            day = day_of(int(opened.get("received_ms") or time_ms))
            described[key_id] = KeyEntry(key_id, recorded_subject(opened), day, tuple(sorted(callers[key_id])))
        return described

    return describe


def recovered_note(recovered: Recovered, subject: str | None = None) -> str:
    """What a walk of the keys found outside the index, for an operator ("" when nothing)."""
    note = ""
    if recovered.entries:
        mine = sum(entry.subject == subject for entry in recovered.entries) if subject is not None else 0
        note += (f"; {len(recovered.entries)} orphaned keys (missing from the key index) found and put back"
                 + (f", {mine} of them this subject's" if subject is not None else ""))
    if recovered.unattributed:
        note += (f"; {len(recovered.unattributed)} orphaned keys seal no record of this log and name no subject: "
                 f"left in place ({', '.join(recovered.unattributed)})")
    return note
