"""Incremental detokenization that never splits a UTF-8 character or invents spaces.

Decoding token by token breaks multi-byte characters (a Chinese character is often two or three
byte-level tokens) and, for SentencePiece-style tokenizers, drops leading spaces. We re-decode a
short window instead: text is released only once the window decodes without a trailing U+FFFD,
and the window starts a few tokens back (prompt context included) so word boundaries decode as
they do inside the full sequence. Special tokens are skipped; tokenization spaces are not cleaned.
"""

from __future__ import annotations

from typing import Any, Protocol

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 5


class Decoder(Protocol):
    def decode(self, token_ids: list[int], **kwargs: Any) -> str: ...


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas; ``flush`` releases what is held at the end."""

    def __init__(self, tokenizer: Decoder, context_ids: list[int] | None = None) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = list((context_ids or [])[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

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
