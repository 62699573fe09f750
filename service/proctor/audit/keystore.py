"""The subjects' data keys, kept outside the log: destroying one erases what it sealed (crypto-shredding).

Why outside: the log is append-only and every row is a leaf of a Merkle tree whose roots were signed and handed
out, so no record can be deleted without breaking every proof. A record's personal content is sealed under a key
instead (audit/sealing.py); destroying the key leaves the sealed bytes, the chain, the tree, every checkpoint and
every proof as they were, and the content unreadable by anyone.

A key seals one subject's records of one UTC day, so erasure (all of a subject's keys) and retention (the keys of
the days past it, audit/retention.py) are both a matter of destroying keys. Each key's entry names its subject,
its day and the callers whose records it sealed (what a hold on a caller covers). A key id is random: the records
name it, never the subject.

``FileKeyStore`` (the default: ``<audit db>.keys/``, mode 0700) keeps one file of 32 random bytes per key and an
index of the entries. ``destroy`` overwrites a key's file, syncs and unlinks it, and drops its entry.
(Overwriting is best effort on flash storage and copy-on-write file systems; a KMS keeps keys where destruction
is guaranteed: implement ``KeyStore`` for it.) One machine's file store serves the servers on that machine;
replicas sharing a PostgreSQL log share a KMS. The index is rewritten whole when a key is made (once a subject a
day): fine for thousands of keys; a log of many more subjects wants a KMS too.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

KEY_BYTES = 32  # AES-256-GCM


@dataclass(frozen=True, slots=True)
class KeyEntry:
    key_id: str
    subject: str
    day: str  # UTC, ISO 8601 (2026-12-05)
    callers: tuple[str, ...]


class KeyStore(Protocol):
    def key_for(self, subject: str, day: str, caller: str) -> tuple[str, bytes]:
        """(key id, key) sealing ``subject``'s records of ``day`` (``caller`` wrote this one), made at the first."""
        ...

    def key(self, key_id: str) -> bytes | None:
        """The key ``key_id`` names; None once destroyed (or never made here)."""
        ...

    def entries(self) -> list[KeyEntry]:
        """Every live key."""
        ...

    def destroy(self, key_id: str) -> bool:
        """Destroy a key; whether it was live."""
        ...


class FileKeyStore:
    """Keys in ``directory``; the index held in memory and read again whenever its file changed (another process,
    ``proctor audit erase``, may have destroyed keys), so a record's key costs a dictionary look-up and a stat."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._index_file = directory / "keys.json"
        self._lock = threading.Lock()
        self._cache: dict[str, bytes] = {}
        self._entries: dict[str, KeyEntry] = {}
        self._by_day: dict[tuple[str, str], str] = {}  # (subject, day) -> key id
        self._seen: tuple[int, int, int] | None = None  # the index file's (inode, size, mtime) when read

    def key_for(self, subject: str, day: str, caller: str) -> tuple[str, bytes]:
        with self._lock:
            self._refresh()
            key_id = self._by_day.get((subject, day))
            key = self._read(key_id) if key_id is not None else None
            if key_id is not None and key is not None:
                entry = self._entries[key_id]
                if caller not in entry.callers:
                    self._entries[key_id] = KeyEntry(key_id, subject, day, tuple(sorted({*entry.callers, caller})))
                    self._save()
                return key_id, key
            key_id, key = secrets.token_hex(16), secrets.token_bytes(KEY_BYTES)
            _write_private(self.directory / f"{key_id}.key", key)
            self._entries[key_id] = KeyEntry(key_id, subject, day, (caller,))
            self._by_day[(subject, day)] = key_id
            self._save()
            self._cache[key_id] = key
            return key_id, key

    def key(self, key_id: str) -> bytes | None:
        if not key_id.isalnum():
            return None
        with self._lock:
            return self._read(key_id)

    def entries(self) -> list[KeyEntry]:
        with self._lock:
            self._refresh()
            return list(self._entries.values())

    def destroy(self, key_id: str) -> bool:
        with self._lock:
            self._refresh()
            entry = self._entries.pop(key_id, None)
            if entry is not None:
                self._by_day.pop((entry.subject, entry.day), None)
            live = entry is not None
            path = self.directory / f"{key_id}.key"
            if path.exists():
                with open(path, "r+b") as handle:  # overwrite before unlinking (best effort; see the module note)
                    handle.write(bytes(KEY_BYTES))
                    handle.flush()
                    os.fsync(handle.fileno())
                path.unlink()
                live = True
            self._cache.pop(key_id, None)
            self._save()
            _sync_directory(self.directory)
            return live

    def _refresh(self) -> None:
        """Read the index again if its file changed since this store last read or wrote it."""
        try:
            stat = self._index_file.stat()
        except FileNotFoundError:
            self._entries, self._by_day, self._seen = {}, {}, None
            return
        seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if seen == self._seen:
            return
        saved = json.loads(self._index_file.read_text(encoding="utf-8"))
        self._entries = {key_id: KeyEntry(key_id, str(entry["subject"]), str(entry["day"]), tuple(entry["callers"]))
                         for key_id, entry in saved.items()}
        self._by_day = {(entry.subject, entry.day): key_id for key_id, entry in self._entries.items()}
        self._seen = seen

    def _save(self) -> None:
        saved = {key_id: {"subject": entry.subject, "day": entry.day, "callers": list(entry.callers)}
                 for key_id, entry in self._entries.items()}
        _write_private(self._index_file, json.dumps(saved, sort_keys=True).encode())
        stat = self._index_file.stat()
        self._seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def _read(self, key_id: str) -> bytes | None:
        path = self.directory / f"{key_id}.key"
        if not path.exists():  # asked every time: another process (proctor audit erase) may have destroyed it
            self._cache.pop(key_id, None)
            return None
        cached = self._cache.get(key_id)
        if cached is not None:
            return cached
        key = path.read_bytes()
        if len(key) != KEY_BYTES:
            return None
        self._cache[key_id] = key
        return key


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, readable by this user only, synced."""
    scratch = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(scratch, path)


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
