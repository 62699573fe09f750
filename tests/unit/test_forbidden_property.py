"""Forbidden phrases, model-free: the mask blocks exactly the tokens that would complete a phrase.

Property test (hypothesis): random phrases (ASCII, accented, CJK) in random letter case, embedded
in random text, split into random valid token sequences of the real tokenizer (pieces encoded
separately, some spelled out byte by byte so characters split across tokens). Feeding the tokens
one by one, a token is banned **if and only if** the text up to it contains the phrase and the
text before it did not: the completing token is blocked every time, nothing else ever is.

The reference is the tests' own oracle (``helpers.oracles.contains_phrase``: whole-string NFKC +
casefold and a ``re`` search), so the automaton, the trie shortcuts and the cache are all checked
against a plain search that shares no code with them; the production safety net ``matches_text`` is
checked against the same oracle on the way. The whole-word and case-sensitive properties also count
what they saw and require a floor of blocks (and of look-alikes left alone), so they cannot pass on
examples where nothing was ever at stake.
"""

from __future__ import annotations

import codecs
import random
from collections import Counter
from typing import Any

import pytest
from helpers.oracles import contains_phrase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proctor.constraints.backends.vocab import token_bytes
from proctor.decoding.forbidden import ForbiddenOptions, ForbiddenTracker, build_index
from proctor.decoding.forbidden.normalize import matches_text

WORDS = ["apple", "secret", "Straße", "café", "naïve", "Ünïcödé", "crème brûlée", "机密", "苹果", "東京都",
         "trade secret", "ﬁnance", "Ｆｕｌｌ"]
FILLER = ["the ", "an ", "x", " ", "和", "，", "-", "e", "é", "ap", "APP", "s", "Strasse ", "\n", "😀", "ß"]


@pytest.fixture(scope="module")
def vocab(tokenizer: Any) -> dict[str, Any]:
    data = token_bytes(tokenizer, len(tokenizer))
    single = {b[0]: i for i, b in enumerate(data) if b is not None and len(b) == 1}
    assert len(single) > 200, "a byte-level vocabulary has a token for (nearly) every byte"
    return {"bytes": data, "single": single, "tokenizer": tokenizer}


def decoded(data: list[bytes | None], ids: list[int]) -> str:
    """The text the detokenizer shows: lossy UTF-8, an incomplete last character held back."""
    return codecs.getincrementaldecoder("utf-8")("replace").decode(b"".join(data[i] or b"" for i in ids), final=False)


def tokenize_randomly(vocab: dict[str, Any], text: str, rng: random.Random) -> list[int]:
    """One of many valid token sequences for ``text``: random pieces, some spelled byte by byte."""
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 4)))) if len(text) > 1 else []
    ids: list[int] = []
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        piece = text[start:end]
        raw = piece.encode("utf-8")
        if rng.random() < 0.25 and all(b in vocab["single"] for b in raw):
            ids += [vocab["single"][b] for b in raw]
        else:
            ids += vocab["tokenizer"](piece, add_special_tokens=False)["input_ids"]
    return ids


def random_case(phrase: str, rng: random.Random) -> str:
    return "".join(ch.upper() if rng.random() < 0.5 else ch.lower() for ch in phrase)


def check_walk(vocab: dict[str, Any], phrase: str, text: str, seed: int, options: ForbiddenOptions) -> int:
    """Walk a random tokenization of ``text``; returns the step at which the phrase was blocked (or -1)."""
    rng = random.Random(seed)
    data = vocab["bytes"]
    ids = tokenize_randomly(vocab, text, rng)
    index = build_index(vocab["tokenizer"], len(data), (phrase,), options)
    tracker = ForbiddenTracker(index)
    tail = "x" if options.whole_word else ""  # the end of the text is not a word boundary mid-stream
    casefold = options.case_insensitive
    for step, token_id in enumerate(ids):
        before = contains_phrase(phrase, decoded(data, ids[:step]) + tail, options.whole_word, casefold)
        after = contains_phrase(phrase, decoded(data, ids[: step + 1]) + tail, options.whole_word, casefold)
        assert matches_text(phrase, decoded(data, ids[: step + 1]) + tail, options.whole_word, casefold) == after
        assert not before
        banned = tracker.banned().contains(token_id)
        text = decoded(data, ids[: step + 1])
        assert banned == after, (f"step {step}: token {token_id} {data[token_id]!r} banned={banned}, but the text "
                                 f"{'would' if after else 'would not'} contain {phrase!r}: {text!r}")
        if after:
            return step
        assert tracker.advance(token_id) is None
    return -1


text_parts = st.lists(st.sampled_from(FILLER), max_size=4).map("".join)
SEPARATORS = [" ", "-", "，", "\n", "😀", ". "]  # non-word characters (whole-word mode)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(phrase=st.sampled_from(WORDS), before=text_parts, after=text_parts, seed=st.integers(0, 2**32 - 1))
def test_the_completing_token_is_blocked_every_time(vocab: dict[str, Any], phrase: str, before: str, after: str,
                                                     seed: int) -> None:
    rng = random.Random(seed)
    text = before + random_case(phrase, rng) + after
    blocked_at = check_walk(vocab, phrase, text, seed, ForbiddenOptions())
    assert blocked_at >= 0, f"{phrase!r} in {text!r} was never blocked"


# Floors for the counted properties below, each of 60 examples: measured over 20 runs (the range seen is in
# the comment) and set well under the least seen, so that only a strategy or a mask that stopped exercising
# the case fails them, not hypothesis' luck.
NEVER_BLOCKED_WALKS = 30  # 53-60 walked (the rest already contained the phrase)
WHOLE_WORD_BLOCKS = 10  # 24-35 whole words blocked (half the examples put separators around the phrase)
WHOLE_WORD_INSIDE_A_WORD = 5  # 13-29 inside a longer word, left alone
CASE_SENSITIVE_BLOCKS = 10  # 30-50 exact spellings blocked (half the examples spell the phrase exactly)
CASE_SENSITIVE_OTHER_CASE = 5  # 10-30 in another case only, left alone


def test_text_without_the_phrase_is_never_blocked(vocab: dict[str, Any]) -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=60, deadline=None)
    @given(phrase=st.sampled_from(WORDS), text=st.lists(st.sampled_from([*FILLER, "appl", "secre", "机", "Stra"]),
                                                       max_size=8).map("".join), seed=st.integers(0, 2**32 - 1))
    def walk(phrase: str, text: str, seed: int) -> None:
        if contains_phrase(phrase, text):
            seen["contains the phrase"] += 1
            return
        assert check_walk(vocab, phrase, text, seed, ForbiddenOptions()) == -1
        seen["walked"] += 1

    walk()
    assert seen["walked"] >= NEVER_BLOCKED_WALKS, seen


def test_whole_word_blocks_words_not_substrings(vocab: dict[str, Any]) -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=60, deadline=None)
    @given(phrase=st.sampled_from(["apple", "trade secret", "café"]), before=text_parts, after=text_parts,
           separated=st.booleans(), seed=st.integers(0, 2**32 - 1))
    def walk(phrase: str, before: str, after: str, separated: bool, seed: int) -> None:
        rng = random.Random(seed)
        word = random_case(phrase, rng)
        if separated:  # non-word characters on both sides: a whole word, which must be blocked
            word = rng.choice(SEPARATORS) + word + rng.choice(SEPARATORS)
        text = before + word + after
        blocked = check_walk(vocab, phrase, text, seed, ForbiddenOptions(whole_word=True)) >= 0
        # A word is known to be whole only once a non-word character follows it (the end of the text may
        # still grow into a longer word), hence the "x".
        assert blocked == contains_phrase(phrase, text + "x", whole_word=True), (phrase, text)
        assert blocked or not separated, f"the whole word {phrase!r} in {text!r} was never blocked"
        if blocked:
            seen["blocked"] += 1
        elif not contains_phrase(phrase, text, whole_word=True):
            seen["inside a word"] += 1

    walk()
    assert seen["blocked"] >= WHOLE_WORD_BLOCKS and seen["inside a word"] >= WHOLE_WORD_INSIDE_A_WORD, seen


def test_case_sensitive_mode_blocks_only_the_exact_case(vocab: dict[str, Any]) -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=60, deadline=None)
    @given(phrase=st.sampled_from(["Apple", "Straße", "机密"]), before=text_parts, after=text_parts,
           exact=st.booleans(), seed=st.integers(0, 2**32 - 1))
    def walk(phrase: str, before: str, after: str, exact: bool, seed: int) -> None:
        rng = random.Random(seed)
        text = before + (phrase if exact else random_case(phrase, rng)) + after
        blocked = check_walk(vocab, phrase, text, seed, ForbiddenOptions(case_insensitive=False)) >= 0
        assert blocked == contains_phrase(phrase, text, casefold=False), (phrase, text)
        assert blocked or not exact, f"the exact spelling {phrase!r} in {text!r} was never blocked"
        if blocked:
            seen["blocked"] += 1
        elif contains_phrase(phrase, text):
            seen["other case"] += 1

    walk()
    assert seen["blocked"] >= CASE_SENSITIVE_BLOCKS and seen["other case"] >= CASE_SENSITIVE_OTHER_CASE, seen


@pytest.mark.parametrize(("phrases", "whole_word", "prefix", "completes"), [
    (("apple", "苹果", "Straße"), False, "Hello there, the APPL", True),
    (("apple", "苹果", "Straße"), False, "我喜欢", True),
    (("apple", "苹果", "Straße"), False, "die STRA", True),
    (("apple pie", "cat"), True, "an apple pie", True),
    (("apple pie", "cat"), True, "con", False),  # "concat..." is no word "cat": nothing may be blocked
])
def test_every_token_of_the_vocabulary_at_a_state(vocab: dict[str, Any], phrases: tuple[str, ...], whole_word: bool,
                                                  prefix: str, completes: bool) -> None:
    """Exhaustive at a few states: the cached set equals a substring test over all 49k tokens."""
    data = vocab["bytes"]
    options = ForbiddenOptions(whole_word=whole_word)
    index = build_index(vocab["tokenizer"], len(data), phrases, options)
    for ids in (vocab["tokenizer"](prefix, add_special_tokens=False)["input_ids"],
                [vocab["single"][b] for b in prefix.encode()] + ([vocab["single"][0xE8]] if not whole_word else [])):
        tracker = ForbiddenTracker(index)
        for token_id in ids:
            assert tracker.advance(token_id) is None
        ban = tracker.banned()
        banned = set(ban.base.nonzero().flatten().tolist()) | set(ban.extra.tolist())
        tail = "x" if whole_word else ""
        base = decoded(data, ids) + tail
        expected = set()
        for token_id, piece in enumerate(data):
            if piece is None:
                continue
            text = decoded(data, [*ids, token_id]) + tail
            if any(contains_phrase(p, text, whole_word) and not contains_phrase(p, base, whole_word)
                   for p in phrases):
                expected.add(token_id)
        assert banned == expected, (sorted(banned - expected)[:5], sorted(expected - banned)[:5])
        assert bool(expected) == completes, f"tokens that complete a phrase after {prefix!r}: {len(expected)}"
