"""The subjects' data keys, kept outside the log: destroying one erases its subject's records (crypto-shredding).

Why outside: the log is append-only and every row is a leaf of a Merkle tree whose roots were signed and handed
out, so no record can be deleted without breaking every proof. A record's personal content is sealed under its
subject's key instead (audit/sealing.py); destroying the key leaves the sealed bytes, the chain, the tree, every
checkpoint and every proof as they were, and the content unreadable by anyone.

``FileKeyStore`` (the default: ``<audit db>.keys/``, mode 0700) keeps one file of 32 random bytes per key and an
index from subject to key id. A key id is random: the records name it, never the subject. ``destroy`` overwrites
the key's file, syncs and unlinks it, and forgets the subject. (Overwriting is best effort on flash storage and
copy-on-write file systems; a KMS keeps keys where destruction is guaranteed: implement ``KeyStore`` for it.)
One machine's file store serves the servers on that machine; replicas sharing a PostgreSQL log share a KMS.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from pathlib import Path
from typing import Protocol

KEY_BYTES = 32  # AES-256-GCM


class KeyStore(Protocol):
    def key_for(self, subject: str) -> tuple[str, bytes]:
        """(key id, key) of ``subject``, created at its first record."""
        ...

    def key(self, key_id: str) -> bytes | None:
        """The key ``key_id`` names; None once destroyed (or never made here)."""
        ...

    def key_id(self, subject: str) -> str | None:
        """The key id of ``subject``'s records (None: no live key)."""
        ...

    def destroy(self, subject: str) -> str | None:
        """Destroy ``subject``'s key; its id (None: it had none)."""
        ...


class FileKeyStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._index = directory / "subjects.json"
        self._lock = threading.Lock()
        self._cache: dict[str, bytes] = {}

    def key_for(self, subject: str) -> tuple[str, bytes]:
        with self._lock:
            subjects = self._subjects()
            key_id = subjects.get(subject)
            if key_id is not None:
                key = self._read(key_id)
                if key is not None:
                    return key_id, key
            key_id, key = secrets.token_hex(16), secrets.token_bytes(KEY_BYTES)
            _write_private(self.directory / f"{key_id}.key", key)
            subjects[subject] = key_id
            _write_private(self._index, json.dumps(subjects, sort_keys=True).encode())
            self._cache[key_id] = key
            return key_id, key

    def key(self, key_id: str) -> bytes | None:
        if not key_id.isalnum():
            return None
        with self._lock:
            return self._read(key_id)

    def key_id(self, subject: str) -> str | None:
        with self._lock:
            return self._subjects().get(subject)

    def destroy(self, subject: str) -> str | None:
        with self._lock:
            subjects = self._subjects()
            key_id = subjects.pop(subject, None)
            if key_id is None:
                return None
            path = self.directory / f"{key_id}.key"
            if path.exists():
                with open(path, "r+b") as handle:  # overwrite before unlinking (best effort; see the module note)
                    handle.write(bytes(KEY_BYTES))
                    handle.flush()
                    os.fsync(handle.fileno())
                path.unlink()
            self._cache.pop(key_id, None)
            _write_private(self._index, json.dumps(subjects, sort_keys=True).encode())
            _sync_directory(self.directory)
            return key_id

    def _subjects(self) -> dict[str, str]:
        if not self._index.exists():
            return {}
        return dict(json.loads(self._index.read_text(encoding="utf-8")))

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
