"""Forbidden-phrase masks: for an automaton state, every token that would complete a phrase.

A state is ``(automaton state, bytes of an incomplete UTF-8 character)``. The banned set of a
state is computed once and cached, so applying it in a step is one tensor operation.

How a state's set is computed without walking all tokens every time:

* **root set** (once per phrase list): walk the whole vocabulary trie from an empty context;
  a token is banned if its own text contains a phrase.
* **any other state**: walk the trie from that state, but only while the automaton still
  remembers text from *before* the token (its depth exceeds the characters read from the
  token). Past that point the state depends on the token's own text alone, exactly as in the
  root walk, so the root set already has the answer. Phrase prefixes are short, so this walk
  touches a few hundred trie nodes instead of the whole vocabulary.
* **inside a character** (the last token ended between the bytes of one character): tokens that
  continue the character are walked exactly; every other token first turns the incomplete
  bytes into U+FFFD (as the detokenizer shows them) and is then treated as above.

Whole-word mode also checks the end of the text: end-of-sequence tokens, and on the last step
any token, are banned when the text would end in a phrase.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from proctor.decoding.forbidden.automaton import NO_MATCH, ROOT, PhraseAutomaton
from proctor.decoding.forbidden.normalize import REPLACEMENT, SEPARATOR, fold_char, is_word_char, phrase_variants
from proctor.decoding.forbidden.vocabulary import VocabularyTrie, _continues, feed_byte

State = tuple[int, bytes]
MAX_CACHED_STATES = 4096


@dataclass(frozen=True, slots=True)
class ForbiddenOptions:
    case_insensitive: bool = True
    whole_word: bool = False


@dataclass(frozen=True, slots=True)
class BanSet:
    """Banned tokens of one state: a shared base mask [V] plus extra ids (possibly empty)."""

    base: torch.Tensor
    extra: torch.Tensor

    def contains(self, token_id: int) -> bool:
        return bool(self.base[token_id]) or bool((self.extra == token_id).any())


class ForbiddenIndex:
    """Phrases × vocabulary for one phrase list and options; shared by all requests using it."""

    def __init__(self, phrases: tuple[str, ...], options: ForbiddenOptions, trie: VocabularyTrie,
                 token_bytes: Sequence[bytes | None]) -> None:
        self.phrases = phrases
        self.options = options
        self._trie = trie
        self._token_bytes = token_bytes
        patterns: list[str] = []
        self._owner: list[int] = []
        for number, phrase in enumerate(phrases):
            for variant in phrase_variants(phrase, options.whole_word, options.case_insensitive):
                patterns.append(variant)
                self._owner.append(number)
        self.automaton = PhraseAutomaton(patterns, collapse_separators=options.whole_word)
        self.initial: State = (self.automaton.step(ROOT, SEPARATOR)[0] if options.whole_word else ROOT, b"")
        self._fold = lru_cache(maxsize=1 << 14)(self._fold_uncached)
        vocab = trie.vocab_size
        first = sorted(trie.children[0])
        continuation = [b for b in first if 0x80 <= b <= 0xBF]
        self._cont_range = ((int(trie.lo[trie.children[0][continuation[0]]]),
                             int(trie.hi[trie.children[0][continuation[-1]]])) if continuation else (0, 0))
        ranges, finals = self._walk(ROOT, b"", prune=False)
        self._root = self._mask_from(ranges, vocab)
        self._root_outside_cont = self._mask_from(self._outside(ranges, *self._cont_range), vocab)
        # Banned on the last step (whole-word): as ever, plus tokens that would end the text in a phrase.
        self._root_final = self._root | self._mask_from(finals, vocab) if options.whole_word else self._root
        self._root_final_outside_cont = self._mask_from(self._outside(ranges + finals, *self._cont_range), vocab)
        self._not_continuation = frozenset(b for b in first if not 0x80 <= b <= 0xBF)
        self._cache: OrderedDict[tuple[State, bool], BanSet] = OrderedDict()
        self._empty = torch.zeros(0, dtype=torch.long)

    # --- used by the tracker ------------------------------------------------------------------
    def banned(self, state: State, last_step: bool = False) -> BanSet:
        """Tokens that would complete a phrase from ``state`` (cached; call from one thread)."""
        key = (state, last_step and self.options.whole_word)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        result = self._compute(state, key[1])
        self._cache[key] = result
        if len(self._cache) > MAX_CACHED_STATES:
            self._cache.popitem(last=False)
        return result

    def advance(self, state: State, token_id: int) -> tuple[State, str | None]:
        """The state after a token, and the phrase it completed (None when none did)."""
        data = self._token_bytes[token_id] if token_id < len(self._token_bytes) else None
        ac, pending = state
        for byte in data or b"":
            chars, pending = feed_byte(pending, byte)
            ac, matched = self._feed(ac, chars)
            if matched != NO_MATCH:
                return (ac, pending), self.phrase_of(matched)
        return (ac, pending), None

    def end_blocked(self, state: State) -> str | None:
        """Whole-word mode: the phrase the text would end in if the sequence ended now."""
        if not self.options.whole_word:
            return None
        matched = self.automaton.step(state[0], SEPARATOR)[1]
        return self.phrase_of(matched) if matched != NO_MATCH else None

    def phrase_of(self, pattern: int) -> str:
        return self.phrases[self._owner[pattern]]

    # --- computing ban sets ---------------------------------------------------------------------
    def _fold_uncached(self, ch: str) -> str:
        folded = fold_char(ch, self.options.case_insensitive)
        if not self.options.whole_word:
            return folded
        return "".join(c if is_word_char(c) else SEPARATOR for c in folded)

    def _feed(self, ac: int, chars: str) -> tuple[int, int]:
        for ch in chars:
            for folded in self._fold(ch):
                ac, matched = self.automaton.step(ac, folded)
                if matched != NO_MATCH:
                    return ac, matched
        return ac, NO_MATCH

    def _walk(self, ac: int, pending: bytes, *, prune: bool, first_bytes: frozenset[int] | None = None
              ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Depth-first over the trie from a state: (banned position ranges, banned-at-the-end ranges).

        With ``prune`` the walk stops where the automaton no longer remembers text from before
        the token (the root set covers the rest); ``first_bytes`` limits the first byte.
        """
        trie, automaton, whole_word = self._trie, self.automaton, self.options.whole_word
        banned: list[tuple[int, int]] = []
        finals: list[tuple[int, int]] = []
        stack: list[tuple[int, int, bytes, int]] = [(0, ac, pending, 0)]
        while stack:
            node, state, held, read = stack.pop()
            for byte, child in trie.children[node].items():
                if node == 0 and first_bytes is not None and byte not in first_bytes:
                    continue
                chars, rest = feed_byte(held, byte)
                current, count, matched = state, read, NO_MATCH
                for ch in chars:
                    for folded in self._fold(ch):
                        collapsed = whole_word and folded == SEPARATOR and automaton.last_char[current] == SEPARATOR
                        current, matched = automaton.step(current, folded)
                        count += 0 if collapsed else 1
                        if matched != NO_MATCH:
                            break
                    if matched != NO_MATCH:
                        break
                if matched != NO_MATCH:
                    banned.append((int(trie.lo[child]), int(trie.hi[child])))
                    continue
                exact = int(trie.exact[child])
                if whole_word and exact and automaton.step(current, SEPARATOR)[1] != NO_MATCH:
                    start = int(trie.lo[child])
                    finals.append((start, start + exact))
                if prune and automaton.depth[current] <= count:
                    continue
                stack.append((child, current, rest, count))
        return banned, finals

    def _compute(self, state: State, last_step: bool) -> BanSet:
        ac, pending = state
        vocab = self._trie.vocab_size
        if not pending:
            banned, finals = self._walk(ac, b"", prune=True)
            if last_step:
                return BanSet(self._root_final, self._ids(banned + finals))
            return BanSet(self._root, self._ids(banned))
        # Tokens that continue the incomplete character: walked exactly, no shortcut applies.
        continuing = frozenset(b for b in self._trie.children[0] if _continues(pending, b))
        inside, inside_finals = self._walk(ac, pending, prune=False, first_bytes=continuing)
        # Every other token first shows the incomplete bytes as U+FFFD, then reads as from a clean state.
        flushed, matched = self._feed(ac, REPLACEMENT)
        cont_lo, cont_hi = self._cont_range
        if matched != NO_MATCH:
            outside = [(0, cont_lo), (cont_hi, len(self._trie.order))]
            return BanSet(torch.zeros(vocab, dtype=torch.bool), self._ids(outside + inside))
        banned, finals = self._walk(flushed, b"", prune=True, first_bytes=self._not_continuation)
        if last_step:
            return BanSet(self._root_final_outside_cont, self._ids(banned + finals + inside + inside_finals))
        return BanSet(self._root_outside_cont, self._ids(banned + inside))

    # --- small helpers --------------------------------------------------------------------------
    def _ids(self, ranges: list[tuple[int, int]]) -> torch.Tensor:
        if not ranges:
            return self._empty
        order = self._trie.order
        return torch.from_numpy(np.unique(np.concatenate([order[lo:hi] for lo, hi in ranges])))

    def _mask_from(self, ranges: list[tuple[int, int]], vocab: int) -> torch.Tensor:
        mask = np.zeros(vocab, dtype=np.bool_)
        order = self._trie.order
        for lo, hi in ranges:
            mask[order[lo:hi]] = True
        return torch.from_numpy(mask)

    @staticmethod
    def _outside(ranges: list[tuple[int, int]], lo_cut: int, hi_cut: int) -> list[tuple[int, int]]:
        """The parts of position ranges outside [lo_cut, hi_cut)."""
        out = []
        for lo, hi in ranges:
            if lo < lo_cut:
                out.append((lo, min(hi, lo_cut)))
            if hi > hi_cut:
                out.append((max(lo, hi_cut), hi))
        return out


@dataclass
class _TokenizerEntry:
    trie: VocabularyTrie
    token_bytes: Sequence[bytes | None]
    indexes: OrderedDict[tuple[tuple[str, ...], ForbiddenOptions], ForbiddenIndex]


_lock = threading.Lock()
_entries: weakref.WeakKeyDictionary[object, _TokenizerEntry] = weakref.WeakKeyDictionary()
MAX_CACHED_INDEXES = 16


def build_index(tokenizer: object, vocab_size: int, phrases: tuple[str, ...],
                options: ForbiddenOptions) -> ForbiddenIndex:
    """The index for a phrase list, built once per (tokenizer, phrases, options) and cached.

    The vocabulary trie is built once per tokenizer. Builds are serialised: two requests with
    the same new list wait for one build instead of doing it twice.
    """
    from proctor.constraints.backends.vocab import token_bytes

    with _lock:
        entry = _entries.get(tokenizer)
        if entry is None:
            data = token_bytes(tokenizer, vocab_size)
            entry = _TokenizerEntry(VocabularyTrie.build(data), data, OrderedDict())
            _entries[tokenizer] = entry
        key = (tuple(sorted(set(phrases))), options)
        index = entry.indexes.get(key)
        if index is None:
            index = ForbiddenIndex(key[0], options, entry.trie, entry.token_bytes)
            entry.indexes[key] = index
            if len(entry.indexes) > MAX_CACHED_INDEXES:
                entry.indexes.popitem(last=False)
        entry.indexes.move_to_end(key)
        return index


def clear_index_cache() -> None:
    """Forget every built trie and index (benchmarks measuring a cold build)."""
    with _lock:
        _entries.clear()
