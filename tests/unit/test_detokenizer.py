"""IncrementalDetokenizer with the real (byte-level BPE) tokenizer: deltas add up to the full decode."""

from __future__ import annotations

import pytest
import torch

from proctor.engine.detokenizer import REPLACEMENT, IncrementalDetokenizer, text_decoder

ENGLISH = "The quick brown fox jumps over the lazy dog. It's 3:45pm -- isn't it?  Double  spaces, tabs\tand\nnewlines."
CHINESE = "今天天气很好。我们去公园散步吧！这个模型能正确处理中文吗？当然可以，每个字都不会被拆坏。"
EMOJI = "Party time 🎉🎉 with family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵 — ok 👍🏽!"
MIXED = "Résumé naïve café — 日本語テキスト, 한국어, Ελληνικά, русский; 数字 12345 🙂 done."
TEXTS = {"english": ENGLISH, "chinese": CHINESE, "emoji": EMOJI, "mixed": MIXED}


def stream(tokenizer, ids: list[int], context: list[int] | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    detok = IncrementalDetokenizer(tokenizer, context)
    deltas = [detok.push(i) for i in ids]
    deltas.append(detok.flush())
    return deltas


def full(tokenizer, ids: list[int]) -> str:  # type: ignore[no-untyped-def]
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def encode(tokenizer, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_deltas_add_up_to_the_full_decode(tokenizer, name: str) -> None:  # type: ignore[no-untyped-def]
    ids = encode(tokenizer, TEXTS[name])
    deltas = stream(tokenizer, ids)
    assert "".join(deltas) == full(tokenizer, ids) == TEXTS[name]


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_no_delta_contains_a_replacement_character(tokenizer, name: str) -> None:  # type: ignore[no-untyped-def]
    ids = encode(tokenizer, TEXTS[name])
    deltas = stream(tokenizer, ids)
    assert not any(REPLACEMENT in d for d in deltas), [d for d in deltas if REPLACEMENT in d]


def test_chinese_really_is_split_inside_characters(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Guard for the test above: the tokenizer must split some characters into byte-level pieces."""
    ids = encode(tokenizer, CHINESE)
    assert any(REPLACEMENT in tokenizer.decode([i]) for i in ids)
    deltas = stream(tokenizer, ids)
    assert "" in deltas[:-1], "some tokens must be held back until their character is complete"


def test_each_delta_is_released_as_soon_as_its_characters_are_complete(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = encode(tokenizer, CHINESE)
    deltas = stream(tokenizer, ids)
    released = ""
    for n, delta in enumerate(deltas[:-1], start=1):
        released += delta
        prefix = full(tokenizer, ids[:n])
        # Everything decodable so far is out; only a trailing incomplete character is held.
        assert released == prefix.rstrip(REPLACEMENT)
    assert deltas[-1] == ""


def test_special_tokens_are_skipped(tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = "<|im_start|>user\nHello 世界<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|><|endoftext|>"
    ids = encode(tokenizer, text)
    special = set(tokenizer.all_special_ids)
    assert special & set(ids), "the text must contain special tokens"
    deltas = stream(tokenizer, ids)
    joined = "".join(deltas)
    assert joined == full(tokenizer, ids)
    assert "<|im_start|>" not in joined and "<|im_end|>" not in joined and "<|endoftext|>" not in joined
    assert joined == "user\nHello 世界\nassistant\nHi there!"


def test_no_invented_or_cleaned_up_spaces(tokenizer) -> None:  # type: ignore[no-untyped-def]
    # clean_up_tokenization_spaces would turn " ," into "," and " n't" into "n't".
    text = "unbelievably , interesting . Isn 't it ? a  b   c"
    ids = encode(tokenizer, text)
    assert len(ids) > 10
    assert "".join(stream(tokenizer, ids)) == text


@pytest.mark.parametrize(("prompt", "completion"), [
    ("The capital of France is", " Paris, and the capital of Japan is Tokyo."),
    ("User: 你好", "，我是一个助手。 Nice to meet you."),
    ("<|im_start|>assistant\n", "Sure — here it is."),
])
def test_continuation_after_prompt_context_decodes_as_in_the_full_text(tokenizer, prompt: str, completion: str) -> None:  # type: ignore[no-untyped-def]
    prompt_ids = encode(tokenizer, prompt)
    completion_ids = encode(tokenizer, completion)
    deltas = stream(tokenizer, completion_ids, context=prompt_ids)
    whole = full(tokenizer, prompt_ids + completion_ids)
    assert whole == full(tokenizer, prompt_ids) + "".join(deltas)
    assert "".join(deltas) == completion
    assert deltas[0].startswith(completion[0]), "a leading space must not be dropped"


def test_context_that_starts_inside_a_character_is_harmless(tokenizer) -> None:  # type: ignore[no-untyped-def]
    # Only the last few prompt tokens are kept as context; they may begin mid-character.
    prompt_ids = encode(tokenizer, "很长的中文提示词语句")
    completion = "继续写下去。"
    for cut in range(1, 6):
        deltas = stream(tokenizer, encode(tokenizer, completion), context=prompt_ids[cut:])
        assert "".join(deltas) == completion


def test_flush_drops_an_incomplete_final_character(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Generation may stop between the bytes of one character: flush releases no U+FFFD."""
    ids = encode(tokenizer, "ab好")
    pieces = [i for i in ids if REPLACEMENT in tokenizer.decode([i])]
    assert len(pieces) >= 2, "the test needs a character the tokenizer splits over byte-level tokens"
    cut = ids.index(pieces[-1])  # stop before the character's last byte-level token
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.push(i) for i in ids[:cut]]
    tail = detok.flush()
    assert REPLACEMENT not in tail
    assert "".join(deltas) + tail == "ab"
    assert detok.flush() == ""


def test_flush_releases_complete_held_text(tokenizer) -> None:  # type: ignore[no-untyped-def]
    detok = IncrementalDetokenizer(tokenizer)
    ids = encode(tokenizer, "x好")
    out = "".join(detok.push(i) for i in ids)
    assert out + detok.flush() == "x好"


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_the_direct_decoder_gives_the_tokenizers_text(tokenizer, skip_special_tokens: bool) -> None:  # type: ignore[no-untyped-def]
    """The detokenizer calls the Rust tokenizer directly; it must give what ``tokenizer.decode`` gives,
    special tokens, byte pieces of CJK characters and spaces included."""
    generator = torch.Generator().manual_seed(4)
    special = sorted(tokenizer.all_special_ids)
    cjk = tokenizer("合同双方同意保密条款。 Both parties agree.", add_special_tokens=False)["input_ids"]
    decode = text_decoder(tokenizer, skip_special_tokens)
    for length in (1, 2, 5, 17, 40):
        for _ in range(20):
            ids = torch.randint(0, len(tokenizer), (length,), generator=generator).tolist()
            ids[length // 2] = special[length % len(special)]
            for sample in (ids, cjk[:length], ids[:2] + cjk[1:length]):
                expected = tokenizer.decode(sample, skip_special_tokens=skip_special_tokens,
                                            clean_up_tokenization_spaces=False)
                assert decode(sample) == expected, sample
