"""The prefix cache: prompts' full chunks of keys and values, kept for later prompts that start the same way.

Why it is exact: every prompt position is computed as a row of its own (engine/batch.py), so chunk ``i``'s keys
and values (positions iC … (i+1)C, C = ``prefill_chunk_tokens``) depend on the tokens up to its end only, not
on how the prompt was split over steps nor on what else shared them. A cached chunk is therefore the very bits a
cold prompt computes there: a request that takes its first ``m`` chunks from here and is fed the rest from
position mC gets the logits it would get with an empty cache (tests/integration/test_fewer_steps_real.py). The
last prompt token is always fed (its logits give the first token), so at most ``(len - 1) // C`` chunks are
reused; a prompt of C tokens or fewer never touches the cache.

Keys are a hash chain over the chunks' token ids, like vLLM's block hashes: chunk ``i``'s key is
sha256(key of chunk ``i - 1`` ‖ its token ids), and the chain's root names the weights' fingerprint, the
weights mode, C and the caller's namespace (api/call_runner.admit). One caller's prompts are never reused
for, nor timed by, another caller. A hit also compares the chunk's tokens, so no hash collision can ever
hand back another prompt's chunk.

Memory is bounded by ``prefix_cache_mb``; the least recently used chunk leaves first. A lookup touches a
chain from its last chunk to its first, so the first chunks, which every longer prompt shares, leave last.
A request whose scope is None (``cache_prompt: false``, or a caller whose entry says ``prompt_cache:
false``) neither reads nor leaves anything here.

Erasure reaches it: each chunk names its subject, and with ``--audit-encryption subject`` the server drops the
chunks of every subject that has no live key left (audit/memory_erasure.py), a few seconds after
``proctor audit erase`` (or the retention sweep) destroyed them.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class CachedChunk:
    tokens: tuple[int, ...]
    keys: torch.Tensor  # [layers, KV heads, C, head dim], the cache's dtype
    values: torch.Tensor
    subject: str = ""  # whose prompt it is (the request's subject_id): an erasure drops it (``forget``)
    stored_at: float = field(default_factory=time.monotonic)

    @property
    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()


@dataclass(slots=True)
class CacheCounts:
    """Totals since start (read by the metrics scrape from another thread: plain ints)."""

    hit_tokens: int = 0  # prompt tokens whose chunks came from the cache
    miss_tokens: int = 0  # reusable prompt tokens (full chunks before the last token) that were not there
    evicted_chunks: int = 0
    forgotten_chunks: int = 0  # dropped because their subject was erased (``forget``)
    bytes: int = 0


class PrefixCache:
    def __init__(self, capacity_bytes: int, model_key: str, chunk_tokens: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.chunk_tokens = chunk_tokens
        self._root = hashlib.sha256(f"proctor prefix cache\0{model_key}\0{chunk_tokens}".encode()).digest()
        self._chunks: OrderedDict[bytes, CachedChunk] = OrderedDict()
        self._lock = threading.Lock()  # the engine thread writes; the metrics scrape reads the counts
        self.counts = CacheCounts()

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0 and self.chunk_tokens > 0

    def capacity_chunks(self, bytes_per_token: int) -> int:
        """How many chunks the budget holds when a token's keys and values take ``bytes_per_token`` (``store``
        evicts past the budget, so never more)."""
        return self.capacity_bytes // (self.chunk_tokens * bytes_per_token) if self.enabled else 0

    def chain(self, scope: str, prompt: list[int]) -> list[bytes]:
        """The keys of ``prompt``'s full chunks, first to last."""
        size = self.chunk_tokens
        key = hashlib.sha256(self._root + b"\0" + scope.encode()).digest()
        keys = []
        for start in range(0, len(prompt) // size * size, size):
            chunk = prompt[start:start + size]
            key = hashlib.sha256(key + b"".join(token.to_bytes(4, "little") for token in chunk)).digest()
            keys.append(key)
        return keys

    def lookup(self, keys: list[bytes], prompt: list[int]) -> list[CachedChunk]:
        """The cached chunks that begin ``prompt`` (the longest run from its first chunk, before its last token),
        counted and touched as used."""
        found = self.peek(keys, prompt)
        self.use(keys, prompt, found)
        return found

    def peek(self, keys: list[bytes], prompt: list[int]) -> list[CachedChunk]:
        """What ``lookup`` would hand back, changing nothing (the step plan reads it: engine/scheduler.py)."""
        size = self.chunk_tokens
        found: list[CachedChunk] = []
        with self._lock:
            for index, key in enumerate(keys[:(len(prompt) - 1) // size]):
                chunk = self._chunks.get(key)
                if chunk is None or list(chunk.tokens) != prompt[index * size:(index + 1) * size]:
                    break
                found.append(chunk)
        return found

    def use(self, keys: list[bytes], prompt: list[int], found: list[CachedChunk]) -> None:
        """Count a prompt's hit and miss tokens and touch its ``found`` chunks: the chain's first chunks end most
        recently used."""
        size = self.chunk_tokens
        reusable = len(keys[:(len(prompt) - 1) // size])
        with self._lock:
            for key in reversed(keys[:len(found)]):
                if key in self._chunks:  # (an erasure may have dropped it since the peek)
                    self._chunks.move_to_end(key)
            self.counts.hit_tokens += len(found) * size
            self.counts.miss_tokens += (reusable - len(found)) * size

    def store(self, keys: list[bytes], chunk: CachedChunk) -> None:
        """Keep ``chunk`` under the last of ``keys`` (its chain from the first chunk), evicting the least recently
        used chunks beyond the budget; the chunks before it in the chain are touched after it."""
        if chunk.nbytes > self.capacity_bytes:
            return
        key = keys[-1]
        with self._lock:
            if key not in self._chunks:
                self._chunks[key] = chunk
                self.counts.bytes += chunk.nbytes
            for earlier in reversed(keys):
                if earlier in self._chunks:
                    self._chunks.move_to_end(earlier)
            while self.counts.bytes > self.capacity_bytes:
                _, evicted = self._chunks.popitem(last=False)
                self.counts.bytes -= evicted.nbytes
                self.counts.evicted_chunks += 1

    def forget(self, erased: Callable[[str, float], bool]) -> int:
        """Drop every chunk for whose subject and time stored (``time.monotonic()``) ``erased`` is true: its
        subject's keys were destroyed (audit/memory_erasure.py); how many were dropped. A chain broken here only
        misses from that chunk on; what is left of it leaves by the LRU."""
        with self._lock:
            gone = [key for key, chunk in self._chunks.items() if erased(chunk.subject, chunk.stored_at)]
            for key in gone:
                self.counts.bytes -= self._chunks.pop(key).nbytes
            self.counts.forgotten_chunks += len(gone)
        return len(gone)

    def __len__(self) -> int:
        return len(self._chunks)
