"""The bytes each token id stands for, shared by the adapters that need a decoded vocabulary.

Engines match constraints on bytes, so every token must be mapped to the exact bytes the
detokenizer will emit for it. Special tokens (the detokenizer skips them) and ids past the
tokenizer (padding rows of the embedding) map to ``None``: no constraint may ever allow them,
because the text they produce is not the text the constraint checked. The EOS ids are handled
by each engine as stop tokens, apart from this table.

Checked against xgrammar's own decoding for SmolLM2 (byte-level BPE): identical for every id.
Not modelled: SentencePiece decoders that strip the first token's leading space (the table
says " Hello" where the text starts "Hello"); the byte-level tokenizers used here have none.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from functools import lru_cache
from typing import Any

from proctor.constraints.errors import ConstraintError

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
METASPACE = "\u2581"


@lru_cache(maxsize=1)
def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: byte-level BPE writes each byte as one printable char."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


@lru_cache(maxsize=1)
def _byte_level_translation() -> dict[int, int]:
    """``str.translate`` table taking each byte-level char to the char of its byte (then ``latin-1`` gives the
    bytes), and every other char below 256 past it, so that the encoding fails as an unknown char must."""
    table = {ord(char): byte for char, byte in _gpt2_unicode_to_byte().items()}
    return {**{code: 0x100 for code in range(256) if code not in table}, **table}


def vocabulary_kind(tokenizer: Any) -> str:
    """``byte_level`` (GPT-2 style), ``byte_fallback`` (SentencePiece ``<0xNN>``) or ``raw``: read from the
    decoder's own serialisation and the model's flag (the whole tokenizer's JSON is MBs at 152k tokens)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ConstraintError("only fast (Rust) Hugging Face tokenizers are supported by the constraint engines")
    decoder = json.loads(backend.decoder.__getstate__()) if backend.decoder is not None else {}
    decoders = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    types = {d.get("type") for d in decoders if d}
    if "ByteLevel" in types:
        return "byte_level"
    if "ByteFallback" in types or getattr(backend.model, "byte_fallback", False):
        return "byte_fallback"
    return "raw"


def _decode_token(text: str, kind: str) -> bytes | None:
    if kind == "byte_level":
        try:
            return text.translate(_byte_level_translation()).encode("latin-1")
        except UnicodeEncodeError:
            return None  # not a byte-level string: the token cannot be decoded faithfully
    if kind == "byte_fallback":
        match = _BYTE_FALLBACK.match(text)
        if match:
            return bytes([int(match.group(1), 16)])
        return text.replace(METASPACE, " ").encode("utf-8")
    return text.encode("utf-8")


_computed: weakref.WeakKeyDictionary[Any, dict[int, tuple[bytes | None, ...]]] = weakref.WeakKeyDictionary()
_computed_lock = threading.Lock()


def token_bytes(tokenizer: Any, vocab_size: int) -> tuple[bytes | None, ...]:
    """Bytes per token id in ``range(vocab_size)``; ``None`` for ids no constraint may allow.

    Added tokens that are not special are plain text to the detokenizer, so their content is
    taken literally (it is not byte-level encoded in the vocabulary). Computed once per tokenizer
    and size (each constraint engine and the forbidden-phrase index read it: ~0.5 s at 152k tokens).
    """
    with _computed_lock:
        known = _computed.setdefault(tokenizer, {})
        if vocab_size not in known:
            known[vocab_size] = _token_bytes(tokenizer, vocab_size)
        return known[vocab_size]


def _token_bytes(tokenizer: Any, vocab_size: int) -> tuple[bytes | None, ...]:
    kind = vocabulary_kind(tokenizer)
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = {int(i) for i, tok in added.items() if getattr(tok, "special", False)}
    special.update(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
    out: list[bytes | None] = [None] * vocab_size
    for text, index in tokenizer.get_vocab().items():
        if index >= vocab_size or index in special:
            continue
        if index in added:
            out[index] = added[index].content.encode("utf-8")
        else:
            out[index] = _decode_token(text, kind)
    # an empty token could be repeated forever without advancing
    return tuple(None if piece == b"" else piece for piece in out)
