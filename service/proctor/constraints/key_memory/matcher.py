"""The key memory over any engine's matcher: the engine's mask, less the tokens that would write a key twice.

``KeyedMatcher`` wraps a JSON-schema matcher: ``fill_bitmask`` lets the engine fill its row, then clears the bits
of ``KeyMemory.banned()`` (mostly none: one cached lookup). ``advance`` refuses a banned token (a forced or drafted
token that bypassed the mask) before the engine sees it; ``rollback`` undoes both. Rows of llguidance still fill
together on its threads (``fill_together``); the optional faster paths of the engine (``valid_prefix``,
``forced_tokens``, ``fork``) are offered only where the engine has them, each cut where the memory bans a token.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from proctor.constraints.backend import CompiledConstraint, Matcher, fill_bitmasks
from proctor.constraints.key_memory.layer import KeyMemory

_CLEAR = tuple(np.uint32(0xFFFFFFFF ^ (1 << bit)) for bit in range(32))


def clear_bits(bitmask: torch.Tensor, row: int, tokens: tuple[int, ...]) -> None:
    """Clear ``tokens``' bits in ``bitmask[row]`` (an int32 CPU bitmask, 32 tokens a word)."""
    words = bitmask[row].numpy().view(np.uint32)
    for token in tokens:
        words[token >> 5] &= _CLEAR[token & 31]


class KeyedMatcher:
    """An engine's matcher with the key memory over it (the ``Matcher`` protocol)."""

    def __init__(self, inner: Matcher, memory: KeyMemory) -> None:
        self.inner = inner
        self.memory = memory
        # Bound once: these run at every token, and the memory's share of a token is a few µs.
        self._fill = inner.fill_bitmask
        self._advance = inner.advance
        self._banned = memory.banned
        self._read = memory.advance
        self._quoted = memory.quoted_ids

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._fill(bitmask, row)
        banned = self._banned()
        if banned:
            clear_bits(bitmask, row, banned)

    @staticmethod
    def fill_together(bitmask: torch.Tensor, pairs: list[tuple[KeyedMatcher, int]]) -> None:
        """The engines' rows as they fill them (llguidance's together), then each row's banned keys cleared."""
        fill_bitmasks(bitmask, [(matcher.inner, row) for matcher, row in pairs])
        for matcher, row in pairs:
            banned = matcher.memory.banned()
            if banned:
                clear_bits(bitmask, row, banned)

    def advance(self, token_id: int) -> bool:
        if (token_id in self._quoted and token_id in self._banned()) or not self._advance(token_id):
            return False
        self._read(token_id)
        return True

    def can_end(self) -> bool:
        return self.inner.can_end()

    def must_end(self) -> bool:
        return self.inner.must_end()

    def rollback(self, tokens: int) -> None:
        self.inner.rollback(tokens)
        self.memory.rollback(tokens)

    def _unbanned(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the memory takes in a row from here (its state unchanged)."""
        taken = 0
        try:
            for token in tokens:
                if token in self.memory.banned():
                    break
                self.memory.advance(token)
                taken += 1
        finally:
            self.memory.rollback(taken)
        return taken


class KeyedFastMatcher(KeyedMatcher):
    """Over an engine matcher with the faster paths (llguidance): each kept, cut where the memory bans a token."""

    def valid_prefix(self, tokens: list[int]) -> int:
        accepted = int(self.inner.valid_prefix(tokens))  # type: ignore[attr-defined]
        return self._unbanned(tokens[:accepted])

    def forced_tokens(self, limit: int) -> list[int]:
        forced = list(self.inner.forced_tokens(limit))  # type: ignore[attr-defined]
        return forced[:self._unbanned(forced)]

    def fork(self) -> KeyedFastMatcher:
        return KeyedFastMatcher(self.inner.fork(), self.memory.fork())  # type: ignore[attr-defined]


class KeyedCompiled:
    """A compiled JSON-schema constraint whose matchers remember keys (everything else is the engine's);
    ``new_memory`` makes one row's memory (the compiled one, or layer.py's)."""

    def __init__(self, inner: CompiledConstraint, new_memory: Callable[[], KeyMemory]) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.spec = inner.spec
        self._new_memory = new_memory

    def new_matcher(self) -> KeyedMatcher:
        inner = self.inner.new_matcher()
        fast = all(hasattr(inner, name) for name in ("valid_prefix", "forced_tokens", "fork"))
        kind = KeyedFastMatcher if fast else KeyedMatcher
        return kind(inner, self._new_memory())

    def to_bytes(self) -> bytes:
        return self.inner.to_bytes()

    def memory_bytes(self) -> int:
        return self.inner.memory_bytes()
