"""The bytes each token id stands for (constraints/backends/vocab.py), the table every constraint engine and the
forbidden-phrase index build on: read without serialising the whole tokenizer, decoded with a translation
table, computed once per tokenizer."""

from __future__ import annotations

from typing import Any

from proctor.constraints.backends.vocab import _decode_token, _gpt2_unicode_to_byte, token_bytes, vocabulary_kind


def reference(tokenizer: Any, vocab_size: int) -> list[bytes | None]:
    """The table by its definition: each byte-level char through GPT-2's inverse map, one at a time."""
    table = _gpt2_unicode_to_byte()
    added = tokenizer.added_tokens_decoder
    special = {int(i) for i, tok in added.items() if tok.special} | set(tokenizer.all_special_ids)
    out: list[bytes | None] = [None] * vocab_size
    for text, index in tokenizer.get_vocab().items():
        if index >= vocab_size or index in special:
            continue
        if index in added:
            out[index] = added[index].content.encode("utf-8")
            continue
        try:
            out[index] = bytes(table[char] for char in text) or None
        except KeyError:
            out[index] = None
    return out


def test_every_token_is_the_bytes_its_definition_gives(tokenizer: Any) -> None:
    assert vocabulary_kind(tokenizer) == "byte_level"
    size = len(tokenizer) + 64  # padding rows past the tokenizer: no bytes
    table = token_bytes(tokenizer, size)
    assert list(table) == reference(tokenizer, size)
    assert table[tokenizer.convert_tokens_to_ids("Ġthe")] == b" the"
    assert all(piece is None for piece in table[len(tokenizer):])


def test_it_is_computed_once_per_tokenizer_and_size(tokenizer: Any) -> None:
    assert token_bytes(tokenizer, 1000) is token_bytes(tokenizer, 1000)
    assert len(token_bytes(tokenizer, 999)) == 999


def test_a_char_outside_the_byte_level_alphabet_is_no_bytes() -> None:
    assert _decode_token("Ġhi", "byte_level") == b" hi"
    assert _decode_token("Ċ", "byte_level") == b"\n"
    assert _decode_token(" raw space", "byte_level") is None  # 0x20 itself is never a byte-level char
    assert _decode_token("東", "byte_level") is None
    assert _decode_token("\u2581hi", "byte_fallback") == b" hi"
    assert _decode_token("<0x0A>", "byte_fallback") == b"\n"
