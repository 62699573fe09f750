"""Incremental detokenization that never splits a UTF-8 character or invents spaces.

Decoding token by token breaks multi-byte characters (a Chinese character is often two or three
byte-level tokens) and, for SentencePiece-style tokenizers, drops leading spaces. We re-decode a
short window instead: text is released only once the window decodes without a trailing U+FFFD,
and the window starts a few tokens back (prompt context included) so word boundaries decode as
they do inside the full sequence. Special tokens are skipped; tokenization spaces are not cleaned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 5


class Decoder(Protocol):
    def decode(self, token_ids: list[int], **kwargs: Any) -> str: ...


def text_decoder(tokenizer: Decoder, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """``tokenizer.decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)`` as one call.

    A transformers fast tokenizer's decode is its Rust tokenizer's decode behind ~35 µs of Python
    (argument conversion, the clean-up branch); the engine decodes two to three times per token per
    stream, so it calls the Rust tokenizer directly when there is one (the same text:
    tests/unit/test_detokenizer.py)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                        clean_up_tokenization_spaces=False)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas; ``flush`` releases what is held at the end."""

    def __init__(self, tokenizer: Decoder, context_ids: list[int] | None = None) -> None:
        self._decode = text_decoder(tokenizer, skip_special_tokens=True)
        self._ids: list[int] = list((context_ids or [])[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now certain (may be empty)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
            delta = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """Release whatever is still held at the end of the sequence.

        An incomplete character at the very end (generation stopped between the bytes of one
        character) is dropped rather than shown as U+FFFD; its token ids are still reported.
        """
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        tail = new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""
        return tail.rstrip(REPLACEMENT)
