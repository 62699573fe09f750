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
walk below) is made holding an exclusive ``flock`` on ``keys.lock`` (with a thread lock: a flock belongs to an
open file, and a process's threads share theirs), on the index as it is then (read again unless the count of
changes kept in ``keys.lock`` and the index file's identity say it has not changed). Key and index files are
written whole to a scratch name, synced and renamed over, and the directory is synced before a new key is handed
out (a record sealed under a key whose file a crash lost would be erased unasked); a new key's file is written
and synced before the lock is taken, so that keys made side by side share the disk's time. Finding a subject's
key of the day takes no file lock when it exists (a dictionary look-up, a stat of the index, a stat of the key,
under a thread lock held for just that): renames are atomic, and a miss is decided again under the file lock.

Why an entry file beside each key: the index is one file that every change rewrites, so one writer that does not
take the lock (a server older than this, during an upgrade) can still drop keys from it; ``recover`` (which
``erase`` and ``sweep`` run first) walks the ``*.key`` files themselves and puts back any the index lacks, from
their entry files, so an erasure by subject finds that subject's lost keys and a sweep's holds still see their
callers. A separate file rather than a header in the key file: the key's 32 bytes are written once and never
rewritten (a new caller rewrites the entry, not the key, leaving no stale copy of the key on disk), and key files
keep the format every earlier version reads. An entry file is renamed into place but not synced (it would be a
new key's fourth fsync, beside the key's, the index's and the directory's, for what the index holds too): a crash
may leave one empty, and its key is then treated as one an older version made, which has no entry file. Found
outside the index, such a key is described by the records it sealed (``describe``: audit/erasure.py opens one
with the key for its subject), or left in place and reported when it sealed none (asked once a process:
``describe`` reads the log).

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


Describe = Callable[[Sequence[str]], dict[str, KeyEntry]]  # key ids without an entry -> what their records say


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
    ``proctor audit erase``, may have destroyed keys), so a known key costs a dictionary look-up and two stats.
    A change (``_change``) writes its files without holding the look-ups' lock: a new subject's key, synced, does
    not hold up the records of the subjects whose keys exist."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._index_file = directory / INDEX
        self._lock = threading.Lock()  # the state in memory below: held for look-ups, never across a file write
        self._changing = threading.Lock()  # this process's changes one at a time; the flock, other processes'
        self._cache: dict[str, bytes] = {}
        self._entries: dict[str, KeyEntry] = {}
        self._by_day: dict[tuple[str, str], str] = {}  # (subject, day) -> key id
        self._seen: tuple[int, int, int] | None = None  # the index file's (inode, size, mtime) when read
        self._generation: int | None = None  # the count of changes in ``keys.lock`` it was read at (None: unknown)
        self._unattributed: set[str] = set()  # keys ``describe`` knew nothing of: not asked again
        self._makers: dict[tuple[str, str], tuple[threading.Lock, int]] = {}  # (subject, day) -> its lock, users

    def key_for(self, subject: str, day: str, caller: str) -> tuple[str, bytes]:
        found, listed = self._known(subject, day, caller)
        if found is not None and listed:
            return found
        with self._making(subject, day):  # this process's other threads asking for it wait for the one making it
            found, listed = self._known(subject, day, caller)
            if found is not None and listed:
                return found
            made = _made_key(self.directory) if found is None else None  # written and synced before the file lock
            try:
                with self._change() as entries:  # decided again on the index as it is now: another process may
                    found = self._found(entries, subject, day, caller)  # have made the key, or destroyed it
                    if found is not None:
                        return found
                    return self._new_key(entries, subject, day, caller, made or _made_key(self.directory))
            finally:
                if made is not None:  # not taken (another process made the key first; it sealed nothing), or named
                    made[2].unlink(missing_ok=True)

    def _known(self, subject: str, day: str, caller: str) -> tuple[tuple[str, bytes] | None, bool]:
        """``subject``'s live key of ``day`` as the index last read says, and whether it lists ``caller``."""
        with self._lock:
            self._refresh()
            key_id = self._by_day.get((subject, day))
            key = self._read(key_id) if key_id is not None else None
            if key_id is None or key is None:
                return None, False
            return (key_id, key), caller in self._entries[key_id].callers

    @contextlib.contextmanager
    def _making(self, subject: str, day: str) -> Iterator[None]:
        """One thread of this process at a time making (or adding a caller to) ``subject``'s key of ``day``."""
        with self._lock:
            lock, users = self._makers.get((subject, day), (threading.Lock(), 0))
            self._makers[(subject, day)] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._lock:
                lock, users = self._makers.pop((subject, day))
                if users > 1:
                    self._makers[(subject, day)] = (lock, users - 1)

    def _found(self, entries: dict[str, KeyEntry], subject: str, day: str, caller: str) -> tuple[str, bytes] | None:
        """Within a change: ``subject``'s live key of ``day``, ``caller`` added to its entry."""
        for entry in [e for e in entries.values() if (e.subject, e.day) == (subject, day)]:
            key = self.key(entry.key_id)
            if key is None:  # its key is gone (a destroy that did not finish)
                del entries[entry.key_id]
                continue
            if caller not in entry.callers:
                entries[entry.key_id] = self._described(
                    KeyEntry(entry.key_id, subject, day, tuple(sorted({*entry.callers, caller}))))
            return entry.key_id, key
        return None

    def _new_key(self, entries: dict[str, KeyEntry], subject: str, day: str, caller: str,
                 made: tuple[str, bytes, Path]) -> tuple[str, bytes]:
        """Within a change: the key ``made`` (written and synced under a scratch name) named, its entry first."""
        key_id, key, scratch = made
        entries[key_id] = self._described(KeyEntry(key_id, subject, day, (caller,)))  # a key never lacks one
        os.replace(scratch, self._key_file(key_id))
        with self._lock:
            self._cache[key_id] = key
        return key_id, key  # handed out after the index is written and the directory synced (``_change``)

    def key(self, key_id: str) -> bytes | None:
        if not key_id.isalnum():
            return None
        with self._lock:
            return self._read(key_id)

    def entries(self) -> list[KeyEntry]:
        return list(self._read_index()[0].values())

    def destroy(self, key_id: str) -> bool:
        if not key_id.isalnum():
            return False
        with self._change() as entries:
            live = entries.pop(key_id, None) is not None
            path = self._key_file(key_id)
            if path.exists():
                with open(path, "r+b") as handle:  # overwrite before unlinking (best effort; see the module note)
                    handle.write(bytes(max(KEY_BYTES, os.fstat(handle.fileno()).st_size)))
                    handle.flush()
                    os.fsync(handle.fileno())
                path.unlink()
                if not live:  # not in the index: its unlinking is made durable here, not with the index
                    _sync_directory(self.directory)
                live = True
            self._entry_file(key_id).unlink(missing_ok=True)
            with self._lock:
                self._cache.pop(key_id, None)
            return live

    def recover(self, describe: Describe | None = None) -> Recovered:
        """Walk the ``*.key`` files: a key the index lacks goes back in it from its entry file; one without (an
        older version's) from what ``describe`` says of it. Entries and entry files whose key is gone are dropped.
        ``describe`` runs without the locks held (it may read the whole log, while the server makes keys)."""
        with self._change() as entries:
            found, undescribed = self._walk(entries)
        ask = [key_id for key_id in undescribed if key_id not in self._unattributed]
        if not ask or describe is None:
            return Recovered(tuple(found), tuple(undescribed))
        described = describe(ask)
        self._unattributed.update(key_id for key_id in ask if key_id not in described)
        with self._change() as entries:
            for key_id in ask:
                entry = described.get(key_id)
                if entry is not None and key_id not in entries and self._key_file(key_id).exists():
                    entries[key_id] = self._described(KeyEntry(key_id, entry.subject, entry.day, entry.callers))
                    found.append(entries[key_id])
        return Recovered(tuple(found), tuple(key_id for key_id in undescribed if key_id not in described))

    def _walk(self, entries: dict[str, KeyEntry]) -> tuple[list[KeyEntry], list[str]]:
        """Within a change of ``entries``: the keys put back from their entry files, and the keys with none (both
        missing from the index); entries and entry files without a key dropped."""
        names = os.listdir(self.directory)
        keys = {name[:-4] for name in names if name.endswith(".key") and name[:-4].isalnum()}
        described = {name[:-6] for name in names if name.endswith(".entry") and name[:-6].isalnum()}
        found, undescribed = [], []
        for key_id in sorted(keys - entries.keys()):
            entry = self._entry_of(key_id) if key_id in described else None
            if entry is None:
                undescribed.append(key_id)
            else:
                entries[key_id] = entry
                found.append(entry)
        for key_id in [key_id for key_id in entries if key_id not in keys]:
            del entries[key_id]
        for key_id in described - keys:  # its key destroyed, or never written (a crash between the two)
            self._entry_file(key_id).unlink(missing_ok=True)
        return found, undescribed

    @contextlib.contextmanager
    def _change(self) -> Iterator[dict[str, KeyEntry]]:
        """The index as it is now, to change, with this process's other changes and every other process's held
        off (a thread lock, and an exclusive flock on ``keys.lock``: a flock belongs to an open file, which a
        process's threads share); written back when changed, the directory synced, and taken as this store's."""
        with self._changing:
            descriptor = os.open(self.directory / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
                generation = int.from_bytes(os.pread(descriptor, 8, 0), "little")
                entries, seen = self._current(generation)
                before = dict(entries)
                yield entries
                if len(entries) != len(before) or any(entries.get(k) is not v for k, v in before.items()):
                    _write_private(self._index_file, json.dumps({key_id: _saved(entry) for key_id, entry
                                                                 in entries.items()}, sort_keys=True).encode())
                    _sync_directory(self.directory)  # every rename of the change is durable from here
                    seen, generation = _identity(self._index_file.stat()), generation + 1
                    os.pwrite(descriptor, generation.to_bytes(8, "little"), 0)
                with self._lock:
                    self._install(entries, seen, generation)
            finally:
                os.close(descriptor)  # releases the flock

    def _current(self, generation: int) -> tuple[dict[str, KeyEntry], tuple[int, int, int] | None]:
        """Under the file lock: the index, as this store holds it when no change was made since it last read or
        wrote it (every change counts one in ``keys.lock``, and renames the index: an older version's only does
        that), else read again."""
        with self._lock:
            if generation == self._generation and self._seen is not None:
                with contextlib.suppress(FileNotFoundError):
                    if _identity(self._index_file.stat()) == self._seen:
                        return dict(self._entries), self._seen
        return self._read_index()

    def _refresh(self) -> None:
        """Read the index again if its file changed since this store last read or wrote it (a hint: what is
        changed is decided again within ``_change``, on the index as it is then)."""
        try:
            seen: tuple[int, int, int] | None = _identity(self._index_file.stat())
        except FileNotFoundError:
            seen = None
        if seen is None or seen != self._seen:
            self._install(*self._read_index(), None)

    def _read_index(self) -> tuple[dict[str, KeyEntry], tuple[int, int, int] | None]:
        try:
            seen = _identity(os.stat(self._index_file))
            saved = json.loads(self._index_file.read_bytes())
        except FileNotFoundError:
            return {}, None
        return {key_id: _entry(key_id, entry) for key_id, entry in saved.items()}, seen

    def _install(self, entries: dict[str, KeyEntry], seen: tuple[int, int, int] | None,
                 generation: int | None) -> None:
        """Take ``entries`` as the index (under ``self._lock``), as of ``generation`` (None: not known)."""
        self._entries, self._seen, self._generation, self._by_day = entries, seen, generation, {}
        for entry in entries.values():
            self._by_day.setdefault((entry.subject, entry.day), entry.key_id)

    def _described(self, entry: KeyEntry) -> KeyEntry:
        """``entry``, written to its key's entry file: whole and renamed, not synced (a crash may leave it empty;
        its key is then described as an older version's is, by its records)."""
        _write_private(self._entry_file(entry.key_id), json.dumps(_saved(entry), sort_keys=True).encode(),
                       sync=False)
        return entry

    def _entry_of(self, key_id: str) -> KeyEntry | None:
        """A key's entry file (None: unreadable, e.g. left empty by a crash)."""
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


def _identity(stat: os.stat_result) -> tuple[int, int, int]:
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def _saved(entry: KeyEntry) -> dict[str, Any]:
    return {"subject": entry.subject, "day": entry.day, "callers": list(entry.callers)}


def _entry(key_id: str, saved: dict[str, Any]) -> KeyEntry:
    return KeyEntry(key_id, str(saved["subject"]), str(saved["day"]), tuple(str(c) for c in saved["callers"]))


def _made_key(directory: Path) -> tuple[str, bytes, Path]:
    """A new key id and key, its file written and synced under a scratch name (``_new_key`` names it): the slow
    part of a new key, done before the file lock, so that processes and threads making keys do it side by side."""
    key_id, key = secrets.token_hex(16), secrets.token_bytes(KEY_BYTES)
    return key_id, key, _scratch(directory / f"{key_id}.key", key, sync=True)


def _write_private(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically, readable by this user only, synced unless told (the directory: the
    caller's)."""
    os.replace(_scratch(path, data, sync=sync), path)


def _scratch(path: Path, data: bytes, *, sync: bool) -> Path:
    """``data`` in a new file beside ``path`` (a dot name: the walk passes it by), readable by this user only."""
    scratch = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
        if sync:
            handle.flush()
            os.fsync(handle.fileno())
    return scratch


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
