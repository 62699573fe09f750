"""The subjects' data keys, kept outside the log: destroying one erases what it sealed (crypto-shredding).

Why outside: the log is append-only and every row is a leaf of a Merkle tree whose roots were signed and handed
out, so no record can be deleted without breaking every proof. A record's personal content is sealed under a key
instead (audit/sealing.py); destroying the key leaves the sealed bytes, the chain, the tree, every checkpoint and
every proof as they were, and the content unreadable by anyone.

A key seals one subject's records of one UTC day, so erasure (all of a subject's keys) and retention (the keys of
the days past it, audit/retention.py) are both a matter of destroying keys. Each key's entry names its subject,
its day and the callers whose records it sealed (what a hold on a caller covers). A key id is random: the records
name it, never the subject.

``FileKeyStore`` (the default: ``<audit db>.keys/``, mode 0700) keeps one file of 32 random bytes per key
(``<id>.key``), beside it the key's entry (``<id>.entry``, JSON), and an index of all the entries (``keys.json``)
that the server reads to find a subject's key of the day. ``destroy`` overwrites a key's file, syncs and unlinks
it, and drops its entry. (Overwriting is best effort on flash storage and copy-on-write file systems; a KMS keeps
keys where destruction is guaranteed: implement ``KeyStore`` for it.)

One store, whoever opens it: the server makes keys while ``proctor audit erase`` and the retention sweep destroy
others, each in its own process. Every change of the directory (a key made, a caller added, a key destroyed, the
walk below) is made holding an exclusive ``flock`` on ``keys.lock`` (with a thread lock, as a process's threads
share its open files), after reading the index again; every file is written whole to a scratch name, synced and
renamed over, and the directory synced before a new key is handed out. Finding a subject's live key of the day
takes no lock (a dictionary look-up, a stat of the index, a stat of the key): renames are atomic, and a miss is
decided again under the lock.

Why an entry file beside each key: the index is one file that every change rewrites, so one writer that does not
take the lock (a server older than this, during an upgrade) can still drop keys from it; ``recover`` (which
``erase`` and ``sweep`` run first) walks the ``*.key`` files themselves and puts back any the index lacks, from
their entry files, so an erasure by subject finds that subject's lost keys and a sweep's holds still see their
callers. A separate file rather than a header in the key file: the key's 32 bytes are written once and never
rewritten (a new caller rewrites the entry, not the key, leaving no stale copy of the key on disk), and key files
keep the format every earlier version reads. A key an older version made has no entry file; found outside the
index, it is described by the records it sealed (``describe``: audit/erasure.py opens one with it for its
subject), and left in place and reported when it sealed none (asked once a process: ``describe`` reads the log).

One machine's file store serves the servers on that machine; replicas sharing a PostgreSQL log share a KMS. The
index is rewritten whole when a key is made (once a subject a day): fine for thousands of keys; a log of many more
subjects wants a KMS.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

KEY_BYTES = 32  # AES-256-GCM
INDEX, LOCK = "keys.json", "keys.lock"


@dataclass(frozen=True, slots=True)
class KeyEntry:
    key_id: str
    subject: str
    day: str  # UTC, ISO 8601 (2026-12-05)
    callers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Recovered:
    """What ``recover`` found outside the listing: keys put back, and keys it could not say whose they are."""

    entries: tuple[KeyEntry, ...] = ()
    unattributed: tuple[str, ...] = ()  # key ids: no entry file, and ``describe`` knew none (they sealed nothing)


# key ids without an entry -> the entries of those the records they sealed describe
Describe = Callable[[Sequence[str]], dict[str, KeyEntry]]


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

    def recover(self, describe: Describe | None = None) -> Recovered:
        """Keys held but missing from ``entries``, listed again (a KMS that lists what it holds: none).
        ``describe`` names the subject, day and callers of keys that do not carry them."""
        ...


class FileKeyStore:
    """Keys in ``directory``; the index held in memory and read again whenever its file changed (another process,
    ``proctor audit erase``, may have destroyed keys), so a record's key costs a dictionary look-up and two stats."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._index_file = directory / INDEX
        self._lock = threading.Lock()  # this process's threads; the flock on LOCK, the other processes
        self._cache: dict[str, bytes] = {}
        self._entries: dict[str, KeyEntry] = {}
        self._by_day: dict[tuple[str, str], str] = {}  # (subject, day) -> key id
        self._seen: tuple[int, int, int] | None = None  # the index file's (inode, size, mtime) when read
        self._unattributed: set[str] = set()  # keys ``describe`` knew nothing of: not asked again

    def key_for(self, subject: str, day: str, caller: str) -> tuple[str, bytes]:
        with self._lock:
            self._refresh()
            found = self._live(subject, day)
            if found is not None and caller in self._entries[found[0]].callers:
                return found
            with self._exclusive():  # decided again on the index as it is now: another process may have changed it
                self._load()
                found = self._live(subject, day)
                if found is not None:
                    entry = self._entries[found[0]]
                    if caller not in entry.callers:
                        self._put(KeyEntry(entry.key_id, subject, day, tuple(sorted({*entry.callers, caller}))))
                        self._save()
                    return found
                stale = self._by_day.pop((subject, day), None)  # its key is gone (a destroy that did not finish)
                if stale is not None:
                    self._entries.pop(stale, None)
                key_id, key = secrets.token_hex(16), secrets.token_bytes(KEY_BYTES)
                self._put(KeyEntry(key_id, subject, day, (caller,)))  # the entry first: a key never lacks one
                _write_private(self._key_file(key_id), key)
                self._save()  # synced with the directory: the records this key seals will find it after a crash
                self._cache[key_id] = key
                return key_id, key

    def key(self, key_id: str) -> bytes | None:
        if not key_id.isalnum():
            return None
        with self._lock:
            return self._read(key_id)

    def entries(self) -> list[KeyEntry]:
        with self._lock:
            self._load()
            return list(self._entries.values())

    def destroy(self, key_id: str) -> bool:
        if not key_id.isalnum():
            return False
        with self._lock, self._exclusive():
            self._load()
            entry = self._entries.pop(key_id, None)
            if entry is not None and self._by_day.get((entry.subject, entry.day)) == key_id:
                del self._by_day[(entry.subject, entry.day)]
            live = entry is not None
            path = self._key_file(key_id)
            if path.exists():
                with open(path, "r+b") as handle:  # overwrite before unlinking (best effort; see the module note)
                    handle.write(bytes(max(KEY_BYTES, os.fstat(handle.fileno()).st_size)))
                    handle.flush()
                    os.fsync(handle.fileno())
                path.unlink()
                live = True
            self._entry_file(key_id).unlink(missing_ok=True)
            self._cache.pop(key_id, None)
            self._save()
            return live

    def recover(self, describe: Describe | None = None) -> Recovered:
        """Walk the ``*.key`` files: a key the index lacks goes back in it from its entry file; one without (an
        older version's) from what ``describe`` says of it. Entries and entry files whose key is gone are dropped.
        ``describe`` runs without the locks held (it may read the whole log, while the server makes keys)."""
        with self._lock, self._exclusive():
            self._load()
            found, undescribed = self._walk()
        ask = [key_id for key_id in undescribed if key_id not in self._unattributed]
        if not ask or describe is None:
            return Recovered(tuple(found), tuple(undescribed))
        described = describe(ask)
        self._unattributed.update(key_id for key_id in ask if key_id not in described)
        with self._lock, self._exclusive():
            self._load()
            for key_id in undescribed:
                entry = described.get(key_id)
                if entry is not None and key_id not in self._entries and self._key_file(key_id).exists():
                    self._put(KeyEntry(key_id, entry.subject, entry.day, entry.callers))
                    found.append(self._entries[key_id])
            self._save()
        return Recovered(tuple(found), tuple(key_id for key_id in undescribed if key_id not in described))

    def _walk(self) -> tuple[list[KeyEntry], list[str]]:
        """Under the locks: the keys put back from their entry files, and the keys with none (both missing from
        the index); the index saved when it changed."""
        names = os.listdir(self.directory)
        keys = {name[:-4] for name in names if name.endswith(".key") and name[:-4].isalnum()}
        described = {name[:-6] for name in names if name.endswith(".entry") and name[:-6].isalnum()}
        found, undescribed = [], []
        for key_id in sorted(keys - self._entries.keys()):
            entry = self._entry_of(key_id) if key_id in described else None
            if entry is None:
                undescribed.append(key_id)
            else:
                self._remember(entry)
                found.append(entry)
        gone = [key_id for key_id in self._entries if key_id not in keys]
        for key_id in gone:
            entry = self._entries.pop(key_id)
            if self._by_day.get((entry.subject, entry.day)) == key_id:
                del self._by_day[(entry.subject, entry.day)]
        for key_id in described - keys:  # its key destroyed, or never written (a crash between the two)
            self._entry_file(key_id).unlink(missing_ok=True)
        if found or gone or described - keys:
            self._save()
        return found, undescribed

    def _live(self, subject: str, day: str) -> tuple[str, bytes] | None:
        key_id = self._by_day.get((subject, day))
        key = self._read(key_id) if key_id is not None else None
        return (key_id, key) if key_id is not None and key is not None else None

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """The directory's lock, across processes (held with ``self._lock``, which orders this process's threads:
        a flock belongs to an open file, and every thread of a process could hold the same one)."""
        descriptor = os.open(self.directory / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # releases the flock

    def _refresh(self) -> None:
        """Read the index again if its file changed since this store last read or wrote it (a hint: what is
        changed is decided again under the lock, on the index read again)."""
        try:
            stat = self._index_file.stat()
        except FileNotFoundError:
            self._entries, self._by_day, self._seen = {}, {}, None
            return
        if (stat.st_ino, stat.st_size, stat.st_mtime_ns) != self._seen:
            self._load()

    def _load(self) -> None:
        """Read the index."""
        try:
            stat = os.stat(self._index_file)
            saved = json.loads(self._index_file.read_bytes())
        except FileNotFoundError:
            self._entries, self._by_day, self._seen = {}, {}, None
            return
        self._entries = {key_id: _entry(key_id, entry) for key_id, entry in saved.items()}
        self._by_day = {}
        for entry in self._entries.values():
            self._by_day.setdefault((entry.subject, entry.day), entry.key_id)
        self._seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def _put(self, entry: KeyEntry) -> None:
        """Write a key's entry file (under the locks) and take it into the index in memory."""
        _write_private(self._entry_file(entry.key_id), json.dumps(_saved(entry), sort_keys=True).encode())
        self._remember(entry)

    def _remember(self, entry: KeyEntry) -> None:
        self._entries[entry.key_id] = entry
        self._by_day.setdefault((entry.subject, entry.day), entry.key_id)

    def _save(self) -> None:
        """Write the index (under the locks) and sync the directory: every rename before it is durable too."""
        saved = {key_id: _saved(entry) for key_id, entry in self._entries.items()}
        _write_private(self._index_file, json.dumps(saved, sort_keys=True).encode())
        _sync_directory(self.directory)
        stat = self._index_file.stat()
        self._seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def _entry_of(self, key_id: str) -> KeyEntry | None:
        """A key's entry file (None: unreadable, e.g. cut short by a crash before its key was written)."""
        try:
            return _entry(key_id, json.loads(self._entry_file(key_id).read_bytes()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _key_file(self, key_id: str) -> Path:
        return self.directory / f"{key_id}.key"

    def _entry_file(self, key_id: str) -> Path:
        return self.directory / f"{key_id}.entry"

    def _read(self, key_id: str) -> bytes | None:
        path = self._key_file(key_id)
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


def _saved(entry: KeyEntry) -> dict[str, Any]:
    return {"subject": entry.subject, "day": entry.day, "callers": list(entry.callers)}


def _entry(key_id: str, saved: dict[str, Any]) -> KeyEntry:
    return KeyEntry(key_id, str(saved["subject"]), str(saved["day"]), tuple(str(c) for c in saved["callers"]))


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, readable by this user only, synced (the directory: the caller's)."""
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
