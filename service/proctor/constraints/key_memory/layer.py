"""Key memory: which keys each open object of a JSON output already has, and the tokens that would write one again.

The engines' masks do not remember keys (issue 56): llguidance refuses a listed property written twice but takes
any other key again, xgrammar and outlines take every key again. A key written twice makes a document that the
validator reads with one member less than was written, so ``minProperties`` counted by the engine passes on fewer
distinct keys than it asks for, and a member's first value is silently dropped.

``KeyMemory`` reads the output (``JsonReader``, the closer's reader) token by token, with one saved reader state
per token so a matcher's rollback undoes its reading. ``banned()`` lists the tokens whose text would complete a key
the object already has: only tokens holding a quote can (``KeyVocabulary``), and among those only the ones whose
text before the quote finishes a written key, or that hold quotes enough to open and close a key themselves. Each
candidate is then read from the current state by a scratch reader, so the answer is exact: a token is banned iff
reading it completes a key twice in one object. Answers are cached per reader state (the keys of each open object,
the key being written, whether a string is inside an escape), shared by every row of one compiled constraint.
"""

from __future__ import annotations

from typing import Any

from proctor.constraints.json_schema import Frame, JsonReader, escaping
from proctor.constraints.key_memory.vocabulary import KeyVocabulary

CACHED_STATES = 4096  # answers kept per compiled constraint before the cache starts afresh


class _Reader(JsonReader):
    """The reader, noting a key completed in an object that has it already (the schema is not needed here)."""

    def __init__(self) -> None:
        super().__init__(True)
        self.repeated = False

    def key_written(self, frame: Frame, key: str) -> None:
        if key in frame.keys:
            self.repeated = True


class KeyMemory:
    """One row's key memory (``vocab``: the tokens' texts; ``cache``: answers shared by the rows of a constraint)."""

    def __init__(self, vocab: KeyVocabulary, cache: dict[Any, tuple[int, ...]]) -> None:
        self._vocab = vocab
        self._cache = cache
        self._reader = _Reader()
        self._scratch = _Reader()
        self._history: list[Any] = []  # the reader's state before each advance

    def advance(self, token_id: int) -> None:
        self._history.append(self._reader.save())
        text = self._vocab.texts[token_id] if 0 <= token_id < self._vocab.size else None
        if text:
            self._reader.push(text)

    def rollback(self, tokens: int) -> None:
        if tokens <= 0:
            return
        saved = self._history[-tokens]
        del self._history[-tokens:]
        self._reader.restore(saved)

    def fork(self) -> KeyMemory:
        twin = KeyMemory(self._vocab, self._cache)
        twin._history = list(self._history)
        twin._reader.restore(self._reader.save())
        return twin

    def written(self) -> list[tuple[str, ...]]:
        """The keys of each open object, outermost first (what the memory holds)."""
        return [frame.keys for frame in self._reader.stack if frame.kind == "object"]

    def banned(self) -> tuple[int, ...]:
        """The tokens that would complete a key an open object already has (sorted ids; empty mostly)."""
        stack = self._reader.stack
        if not stack or self._reader.broken:
            return ()
        state = _fingerprint(stack)
        if state is None:  # no object has a key yet: only a token writing one key twice by itself could
            if not self._vocab.quadruple_quote:
                return ()
            state = ("no keys", _fingerprint(stack, always=True))
        found = self._cache.get(state)
        if found is None:
            found = self._compute(stack)
            if len(self._cache) >= CACHED_STATES:
                self._cache.clear()
            self._cache[state] = found
        return found

    def _compute(self, stack: list[Frame]) -> tuple[int, ...]:
        saved = self._reader.save()
        banned = []
        for token in sorted(self._candidates(stack)):
            text = self._vocab.texts[token]
            if text is None:
                continue
            self._scratch.restore(saved)
            self._scratch.repeated = False
            self._scratch.push(text)
            if self._scratch.repeated:
                banned.append(token)
        return tuple(banned)

    def _candidates(self, stack: list[Frame]) -> set[int]:
        """Every token that could complete a written key from here (a superset: each is then read to be sure)."""
        vocab = self._vocab
        top = stack[-1]
        if not (top.kind == "object" and top.state == "key"):
            return set(vocab.multi_quote)  # a key opened and closed within the token
        found = set(vocab.triple_quote) | set(vocab.escaped)
        raw = top.raw
        if "\\" in raw or not _plain(raw):
            return found | set(vocab.quoted)
        for key in top.keys:
            if key.startswith(raw):
                found.update(vocab.before_quote.get(key[len(raw):], ()))
        return found


def _plain(raw: str) -> bool:
    """No byte of a character cut between tokens (carried as a surrogate escape) in the key's text."""
    return raw.isascii() or not any("\udc80" <= char <= "\udcff" for char in raw)


def _fingerprint(stack: list[Frame], *, always: bool = False) -> tuple[Any, ...] | None:
    """What the banned tokens depend on; None when no open object has a key (nothing can be written twice)."""
    parts: list[Any] = []
    keys = False
    for frame in stack:
        kind = frame.kind
        if kind == "object":
            keys = keys or bool(frame.keys)
            parts.append((frame.state, frame.keys, frame.raw if frame.state == "key" else ""))
        elif kind == "string":
            parts.append((kind, escaping(frame.raw)))  # inside an escape a quote does not close it
        elif kind == "literal":
            parts.append((kind, frame.raw))
        else:
            parts.append((kind, frame.state))
    return tuple(parts) if keys or always else None
