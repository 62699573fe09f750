"""Bounded LRU cache of compiled constraints, shared by all requests (tier 2 of DESIGN.md rule 5).

Keyed by (engine, kind, canonical spec, syntax, whitespace, tokenizer fingerprint); bounded by
entry count and by the compiled artefacts' approximate memory; compile failures are cached too
(a bad schema sent again costs nothing). Hit/miss counters are exported in stats(), and by
engine in ``engine_counts`` (read by the metrics scrape).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from proctor.constraints.backend import CompiledConstraint
from proctor.constraints.errors import ConstraintError
from proctor.constraints.spec import ConstraintSpec

CacheKey = tuple[str, str, str, str, bool, str]


def cache_key(backend: str, spec: ConstraintSpec, tokenizer_fingerprint: str) -> CacheKey:
    syntax = spec.syntax.value if spec.syntax else ""
    return (backend, spec.kind.value, spec.text, syntax, spec.flexible_whitespace, tokenizer_fingerprint)


@dataclass(frozen=True, slots=True)
class CacheEntry:
    compiled: CompiledConstraint | None
    error: ConstraintError | None
    compile_ms: float
    size_bytes: int


class CompiledCache:
    def __init__(self, max_entries: int = 256, max_bytes: int = 512 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[CacheKey, CacheEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.engine_counts: dict[str, dict[str, int]] = {}  # engine -> hits / misses / evictions

    def _count(self, key: CacheKey, what: str) -> None:
        counts = self.engine_counts.get(key[0])
        if counts is None:
            counts = self.engine_counts[key[0]] = {"hits": 0, "misses": 0, "evictions": 0}
        counts[what] += 1

    def get(self, key: CacheKey) -> CacheEntry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                self._count(key, "misses")
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            self._count(key, "hits")
            return entry

    def put(self, key: CacheKey, entry: CacheEntry) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size_bytes
            self._entries[key] = entry
            self._bytes += entry.size_bytes
            while self._entries and (len(self._entries) > self.max_entries or self._bytes > self.max_bytes):
                evicted_key, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.size_bytes
                self.evictions += 1
                self._count(evicted_key, "evictions")

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._bytes, "hits": self.hits,
                    "misses": self.misses, "evictions": self.evictions}
