"""The few tokens that can complete a JSON key, found once per vocabulary (the key memory reads only these).

A key is completed by its closing quote, so only tokens whose text holds a ``"`` can complete one: 163 of
SmolLM2's 49,152. They are indexed by the text before their first quote (what finishes the key being written) and
indexed again by each text between two of their quotes (a key they could open and close in one token), and kept
apart where a backslash or a cut character is in those texts (a key spelled with an escape, or bytes of a
character, which the by-text lookups do not follow). Token texts are the vocabulary's
bytes (constraints/backends/vocab.py, as the engines read them) decoded with ``surrogateescape``: a character cut
between two tokens keeps its bytes, and a quote, being ASCII, is never inside one.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proctor.constraints.backends.vocab import token_bytes


@dataclass(frozen=True, slots=True)
class KeyVocabulary:
    texts: tuple[str | None, ...]  # per token id; None: no text (special, padding, EOS)
    quoted: tuple[int, ...]  # every token holding a quote
    quoted_set: frozenset[int]
    before_quote: dict[str, tuple[int, ...]]  # text before the first quote -> tokens (no backslash in it)
    escaped: tuple[int, ...]  # quote tokens with a backslash before their first quote that does not escape it
    segments: dict[str, tuple[int, ...]]  # text between two quotes of a token -> tokens (a key they could write)
    irregular: tuple[int, ...]  # tokens with two quotes or more and a backslash or a cut character between them
    quadruple_quote: tuple[int, ...]  # four quotes or more (they could write one key twice by themselves)
    size: int

    @classmethod
    def from_bytes(cls, pieces: tuple[bytes | None, ...]) -> KeyVocabulary:
        texts = tuple(None if piece is None else piece.decode("utf-8", "surrogateescape") for piece in pieces)
        quoted = [index for index, text in enumerate(texts) if text is not None and '"' in text]
        before: dict[str, list[int]] = {}
        segments: dict[str, list[int]] = {}
        escaped, irregular, quadruple = [], [], []
        for index in quoted:
            text = texts[index]
            assert text is not None
            parts = text.split('"')
            head = parts[0]
            if "\\" in head:
                if (len(head) - len(head.rstrip("\\"))) % 2 == 0:  # else the quote is escaped: it closes nothing
                    escaped.append(index)
            else:
                before.setdefault(head, []).append(index)
            between = parts[1:-1]  # each text between two quotes of the token
            if any("\\" in part or not _plain(part) for part in between):
                irregular.append(index)
            for part in dict.fromkeys(between):
                segments.setdefault(part, []).append(index)
            if len(parts) >= 5:
                quadruple.append(index)
        return cls(texts, tuple(quoted), frozenset(quoted), _frozen(before), tuple(escaped), _frozen(segments),
                   tuple(irregular), tuple(quadruple), len(pieces))


def _frozen(index: dict[str, list[int]]) -> dict[str, tuple[int, ...]]:
    return {text: tuple(ids) for text, ids in index.items()}


def _plain(text: str) -> bool:
    """No byte of a character cut between tokens (carried as a surrogate escape) in ``text``."""
    return text.isascii() or not any("\udc80" <= char <= "\udcff" for char in text)


_built: weakref.WeakKeyDictionary[Any, dict[tuple[str, int], Any]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def per_tokenizer(tokenizer: Any, vocab_size: int, kind: str, build: Callable[[], Any]) -> Any:
    """``build()``, once per tokenizer, vocabulary size and ``kind`` of index (a pass over the token texts)."""
    with _lock:
        known = _built.setdefault(tokenizer, {})
        if (kind, vocab_size) not in known:
            known[(kind, vocab_size)] = build()
        return known[(kind, vocab_size)]


def key_vocabulary(tokenizer: Any, vocab_size: int) -> KeyVocabulary:
    """The key vocabulary of a tokenizer (the Python memory's index), built once per tokenizer and size."""
    vocab: KeyVocabulary = per_tokenizer(tokenizer, vocab_size, "python",
                                         lambda: KeyVocabulary.from_bytes(token_bytes(tokenizer, vocab_size)))
    return vocab
