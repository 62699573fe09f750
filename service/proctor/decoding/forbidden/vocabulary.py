"""The vocabulary as a byte trie, plus incremental UTF-8 decoding of one byte at a time.

Tokens are sorted by their bytes, so the tokens below any trie node form one contiguous range
of that order: banning "every token that starts with these bytes" is one slice. Built once per
tokenizer. Special tokens (the detokenizer skips them) and empty tokens are not in the trie:
they add no text, so no phrase can be completed by them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from proctor.decoding.forbidden.normalize import REPLACEMENT


@dataclass(frozen=True, slots=True)
class VocabularyTrie:
    children: list[dict[int, int]]  # node -> {byte: child}
    lo: np.ndarray  # node -> first position (in sorted order) of the tokens below it
    hi: np.ndarray  # node -> one past the last
    exact: np.ndarray  # node -> how many tokens are exactly these bytes (first in its range)
    order: np.ndarray  # sorted position -> token id
    vocab_size: int

    @classmethod
    def build(cls, token_bytes: Sequence[bytes | None]) -> VocabularyTrie:
        spelled = {i: b for i, b in enumerate(token_bytes) if b}
        ids = sorted(spelled, key=spelled.__getitem__)
        children: list[dict[int, int]] = [{}]
        lo, hi, exact = [0], [len(ids)], [0]
        for position, token_id in enumerate(ids):
            node = 0
            for byte in spelled[token_id]:
                child = children[node].get(byte)
                if child is None:
                    child = len(children)
                    children[node][byte] = child
                    children.append({})
                    lo.append(position)
                    hi.append(position)
                    exact.append(0)
                node = child
                hi[node] = position + 1
            exact[node] += 1
        return cls(children, np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64),
                   np.array(exact, dtype=np.int64), np.array(ids, dtype=np.int64), len(token_bytes))


def _sequence_length(lead: int) -> int:
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def _continues(pending: bytes, byte: int) -> bool:
    """Is ``byte`` a valid next byte after the incomplete character ``pending``?"""
    if len(pending) == 1:
        low, high = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}.get(
            pending[0], (0x80, 0xBF))
        return low <= byte <= high
    return 0x80 <= byte <= 0xBF


@lru_cache(maxsize=1 << 14)
def feed_byte(pending: bytes, byte: int) -> tuple[str, bytes]:
    """One byte of output: (characters now complete, bytes of an incomplete character).

    Invalid bytes become U+FFFD, as the detokenizer's lossy decoding shows them.
    """
    if pending:
        if _continues(pending, byte):
            whole = pending + bytes([byte])
            if len(whole) == _sequence_length(whole[0]):
                return whole.decode("utf-8"), b""
            return "", whole
        chars, rest = feed_byte(b"", byte)
        return REPLACEMENT + chars, rest
    if byte < 0x80:
        return chr(byte), b""
    if _sequence_length(byte):
        return "", bytes([byte])
    return REPLACEMENT, b""
