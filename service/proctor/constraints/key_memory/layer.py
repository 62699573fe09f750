"""Key memory: which keys each open object of a JSON output already has, and the tokens that would write one again.

This is the reference, in Python; the server runs its compiled twin (keys.cpp, through native.py) wherever that
builds, held to the same answers token by token (tests/unit/test_key_memory_native.py), and this one where not.

The engines' masks do not remember keys (issue 56): llguidance refuses a listed property written twice but takes
any other key again, xgrammar and outlines take every key again. A key written twice makes a document that the
validator reads with one member less than was written, so ``minProperties`` counted by the engine passes on fewer
distinct keys than it asks for, and a member's first value is silently dropped.

``KeyMemory`` reads the output (``JsonReader``, the closer's reader) token by token. ``banned()`` lists the tokens
whose text would complete a key the object already has. Only a token holding a quote can (``KeyVocabulary``). One
whose text before its first quote finishes the key being written as a written key is banned outright (found by
lookup). One whose text between two of its quotes is a written key (a key opened and closed in the token), or that
spells a key with an escape, is a candidate, read from the current state by a scratch reader (none, at nearly every
token), so the answer is exact: a token is banned iff reading it completes a key twice in one object. Those answers
are cached per reader state, shared by every row of one compiled constraint.

Reading waits for a token with a quote: until one comes nothing can be banned (``_quiet``), so tokens are only
noted, and read together when it comes. Rollback (a matcher's lookahead undoes tokens) drops noted tokens, or
restores the reader from a checkpoint kept every ``CHECKPOINT`` tokens read: a token costs its reading, never a
copy of the reader.
"""

from __future__ import annotations

from typing import Any

from proctor.constraints.json_schema import Frame, JsonReader, escaping
from proctor.constraints.key_memory.vocabulary import KeyVocabulary

CACHED_STATES = 4096  # answers kept per compiled constraint before the cache starts afresh
CHECKPOINT = 16  # tokens between saved reader states (a rollback reads at most this many again)


class _Reader(JsonReader):
    """The reader, noting a key completed in an object that has it already, and marking an object given a key that
    some token holds whole between two quotes (the schema is not needed here)."""

    def __init__(self, vocab: KeyVocabulary) -> None:
        super().__init__(True)
        self._whole = vocab.segments
        self._escapes = bool(vocab.irregular)
        self.repeated = False

    def key_written(self, frame: Frame, key: str) -> None:
        if key in frame.keys:
            self.repeated = True
        if key in self._whole or self._escapes:
            frame.marked = True


class KeyMemory:
    """One row's key memory (``vocab``: the tokens' texts; ``cache``: answers shared by the rows of a constraint)."""

    def __init__(self, vocab: KeyVocabulary, cache: dict[Any, tuple[int, ...]]) -> None:
        self._vocab = vocab
        self._table = vocab.texts
        self._cache = cache
        self._reader = _Reader(vocab)
        self._scratch = _Reader(vocab)
        self._texts: list[str | None] = []  # each token's text, in order
        self._done = 0  # how many of them the reader has read (the rest wait: see ``_catch_up``)
        self._checkpoints: list[tuple[int, Any]] = [(0, self._reader.save())]  # (tokens read, the reader's state)
        self._answer: tuple[int, tuple[int, ...]] | None = None  # (tokens, banned()) for the output as it is
        # Nothing can be banned until a token with a quote comes: no candidate now, and no key begun that a written
        # key could still finish (a token without a quote completes no key, begins none, marks no object). Tokens
        # meanwhile are only noted; the reader reads them when a quote comes.
        self._quiet = False
        self._prefixed: tuple[tuple[str, ...], str, list[str]] = ((), "", [])  # (keys, key begun, keys it begins)

    def advance(self, token_id: int) -> None:
        text = self._table[token_id] if 0 <= token_id < len(self._table) else None
        self._texts.append(text)
        self._answer = None
        if text and '"' in text:
            self._quiet = False

    def rollback(self, tokens: int) -> None:
        if tokens <= 0:
            return
        target = len(self._texts) - tokens
        del self._texts[target:]
        self._answer = None
        self._quiet = False
        if target < self._done:
            while self._checkpoints[-1][0] > target:
                self._checkpoints.pop()
            self._done, saved = self._checkpoints[-1]
            self._reader.restore(saved)

    def _catch_up(self) -> None:
        """Read the tokens noted since the reader last read, keeping a checkpoint every ``CHECKPOINT`` tokens."""
        texts, read = self._texts, self._done
        while read < len(texts):
            upto = min(len(texts), read + CHECKPOINT)
            self._reader.push("".join(text for text in texts[read:upto] if text))
            read = upto
            if read - self._checkpoints[-1][0] >= CHECKPOINT:
                self._checkpoints.append((read, self._reader.save()))
        self._done = read

    def fork(self) -> KeyMemory:
        self._catch_up()
        twin = KeyMemory(self._vocab, self._cache)
        twin._texts = list(self._texts)
        twin._done = self._done
        twin._checkpoints = list(self._checkpoints)
        twin._reader.restore(self._reader.save())
        return twin

    @property
    def quoted_ids(self) -> frozenset[int]:
        """The tokens holding a quote (only such a token can complete a key)."""
        return self._vocab.quoted_set

    def written(self) -> list[tuple[str, ...]]:
        """The keys of each open object, outermost first (what the memory holds)."""
        self._catch_up()
        return [frame.keys for frame in self._reader.stack if frame.kind == "object"]

    def banned(self) -> tuple[int, ...]:
        """The tokens that would complete a key an open object already has (sorted ids; empty nearly always)."""
        answer = self._answer
        read = len(self._texts)
        if answer is not None and answer[0] == read:
            return answer[1]
        found: tuple[int, ...] = ()
        if self._quiet:
            self._answer = (read, found)
            return found
        self._catch_up()
        stack = self._reader.stack
        if stack and not self._reader.broken:
            top = stack[-1]
            plain = top.state == "key" and "\\" not in top.raw and _plain(top.raw)
            unsure = self._candidates(stack)
            sure = self._finishing(top) if plain else ()
            if unsure:
                found = tuple(sorted({*sure, *self._cached(stack, unsure)}))
            elif sure:
                found = sure
            else:
                self._quiet = not (stack[-1].state == "key" and self._prefixed[2])
        self._answer = (read, found)
        return found

    def _candidates(self, stack: list[Frame]) -> set[int]:
        """Tokens that might complete a written key from here, each to be read to be sure (empty nearly always): one
        holding a written key whole between two quotes (its object is marked), one spelling a key with an escape,
        one writing a key twice by itself; every quote token while the key begun holds an escape or a cut
        character."""
        vocab = self._vocab
        found: set[int] = set(vocab.quadruple_quote) if vocab.quadruple_quote else set()
        for frame in stack:
            if frame.marked:
                for key in frame.keys:
                    found.update(vocab.segments.get(key, ()))
                found.update(vocab.irregular)
        top = stack[-1]
        if top.state == "key" and top.keys:  # only an object is ever in state "key"
            if "\\" in top.raw or not _plain(top.raw):
                return found | set(vocab.quoted)
            found.update(vocab.escaped)
        return found

    def _finishing(self, top: Frame) -> tuple[int, ...]:
        """The tokens whose text before their first quote finishes the key begun (plain: no escape, no cut
        character) as a key its object has: each completes that key again, no reading needed. The keys the key
        begun matches are narrowed as it grows."""
        if not top.keys:
            return ()
        raw = top.raw
        keys, begun, matching = self._prefixed
        if keys is not top.keys or not raw.startswith(begun):
            matching = list(top.keys)
        matching = [key for key in matching if key.startswith(raw)]
        self._prefixed = (top.keys, raw, matching)
        before = self._vocab.before_quote
        found = [token for key in matching for token in before.get(key[len(raw):], ())]
        return tuple(sorted(found))

    def _cached(self, stack: list[Frame], candidates: set[int]) -> tuple[int, ...]:
        state = (_fingerprint(stack), frozenset(candidates))
        found = self._cache.get(state)
        if found is None:
            found = self._read(candidates)
            if len(self._cache) >= CACHED_STATES:
                self._cache.clear()
            self._cache[state] = found
        return found

    def _read(self, candidates: set[int]) -> tuple[int, ...]:
        saved = self._reader.save()
        banned = []
        for token in sorted(candidates):
            text = self._vocab.texts[token]
            if text is None:
                continue
            self._scratch.restore(saved)
            self._scratch.repeated = False
            self._scratch.push(text)
            if self._scratch.repeated:
                banned.append(token)
        return tuple(banned)


def _plain(raw: str) -> bool:
    """No byte of a character cut between tokens (carried as a surrogate escape) in the key's text."""
    return raw.isascii() or not any("\udc80" <= char <= "\udcff" for char in raw)


def _fingerprint(stack: list[Frame]) -> tuple[Any, ...]:
    """What reading a token from here depends on: each object's keys and state, the key being written, whether a
    string is inside an escape, a literal's letters."""
    parts: list[Any] = []
    for frame in stack:
        kind = frame.kind
        if kind == "object":
            parts.append((frame.state, frame.keys, frame.raw if frame.state == "key" else ""))
        elif kind == "string":
            parts.append((kind, escaping(frame.raw)))
        elif kind == "literal":
            parts.append((kind, frame.raw))
        else:
            parts.append((kind, frame.state))
    return tuple(parts)
