"""The few tokens that can complete a JSON key, found once per vocabulary (the key memory reads only these).

A key is completed by its closing quote, so only tokens whose text holds a ``"`` can complete one: 163 of
SmolLM2's 49,152. They are indexed by the text before their first quote (what finishes the key being written) and
kept apart when they hold two quotes or more (they can open and close a key in one token) or a backslash (their
key text is spelled with an escape, which the by-text lookup does not follow). Token texts are the vocabulary's
bytes (constraints/backends/vocab.py, as the engines read them) decoded with ``surrogateescape``: a character cut
between two tokens keeps its bytes, and a quote, being ASCII, is never inside one.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

from proctor.constraints.backends.vocab import token_bytes


@dataclass(frozen=True, slots=True)
class KeyVocabulary:
    texts: tuple[str | None, ...]  # per token id; None: no text (special, padding, EOS)
    quoted: tuple[int, ...]  # every token holding a quote
    before_quote: dict[str, tuple[int, ...]]  # text before the first quote -> tokens (no backslash in it)
    escaped: tuple[int, ...]  # quote tokens with a backslash before their first quote
    multi_quote: tuple[int, ...]  # tokens with two quotes or more (they can open and close a key)
    triple_quote: tuple[int, ...]  # three or more (they can close one key, then open and close another)
    quadruple_quote: tuple[int, ...]  # four or more (they can write a key twice by themselves)
    size: int

    @classmethod
    def from_bytes(cls, pieces: tuple[bytes | None, ...]) -> KeyVocabulary:
        texts = tuple(None if piece is None else piece.decode("utf-8", "surrogateescape") for piece in pieces)
        quoted = [index for index, text in enumerate(texts) if text is not None and '"' in text]
        before: dict[str, list[int]] = {}
        escaped, multi = [], []
        for index in quoted:
            text = texts[index]
            assert text is not None
            head = text[:text.index('"')]
            if "\\" in head:
                escaped.append(index)
            else:
                before.setdefault(head, []).append(index)
            if text.count('"') >= 2:
                multi.append(index)
        counts = {index: (texts[index] or "").count('"') for index in multi}
        return cls(texts, tuple(quoted), {head: tuple(ids) for head, ids in before.items()}, tuple(escaped),
                   tuple(multi), tuple(i for i in multi if counts[i] >= 3), tuple(i for i in multi if counts[i] >= 4),
                   len(pieces))


_built: weakref.WeakKeyDictionary[Any, dict[int, KeyVocabulary]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def key_vocabulary(tokenizer: Any, vocab_size: int) -> KeyVocabulary:
    """The key vocabulary of a tokenizer, built once per tokenizer and size (a pass over its token texts)."""
    with _lock:
        known = _built.setdefault(tokenizer, {})
        if vocab_size not in known:
            known[vocab_size] = KeyVocabulary.from_bytes(token_bytes(tokenizer, vocab_size))
        return known[vocab_size]
