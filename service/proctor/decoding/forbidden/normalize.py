"""The text a forbidden phrase is matched against.

Output text is normalised **one character at a time**: NFKC, then Unicode case folding
(``"Ａｐｐｌｅ"``, ``"APPLE"`` and ``"apple"`` all read ``apple``; ``"ß"`` reads ``ss``). Per-character
normalisation is what makes a streaming, cacheable automaton possible: the normalised text of
``a + b`` is the normalised text of ``a`` followed by that of ``b``. It equals whole-string NFKC
for text in composed form, which is what models emit; for decomposed text (``e`` + U+0301) each
phrase is also matched in its decomposed form (see ``phrase_variants``).

Whole-word mode maps every character that is not part of a word (letters, digits, marks, ``_``)
to one separator, and the automaton collapses runs of separators: ``"trade secret"`` then also
blocks ``"trade-secret"`` and ``"trade,  secret"``, but not ``"trade secrets"``.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

SEPARATOR = " "
REPLACEMENT = "\ufffd"


@lru_cache(maxsize=1 << 16)
def fold_char(ch: str, casefold: bool = True) -> str:
    """NFKC (then casefold) of one character; may be several characters ("ß" → "ss", "ﬁ" → "fi")."""
    normal = unicodedata.normalize("NFKC", ch)
    return normal.casefold() if casefold else normal


def fold_text(text: str, casefold: bool = True) -> str:
    return "".join(fold_char(ch, casefold) for ch in text)


@lru_cache(maxsize=1 << 16)
def is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_" or unicodedata.category(ch).startswith("M")


def to_word_stream(folded: str) -> str:
    """Map non-word characters to the separator and collapse runs (whole-word mode)."""
    out: list[str] = []
    for ch in folded:
        mapped = ch if is_word_char(ch) else SEPARATOR
        if mapped == SEPARATOR and out and out[-1] == SEPARATOR:
            continue
        out.append(mapped)
    return "".join(out)


def phrase_variants(phrase: str, whole_word: bool, casefold: bool = True) -> list[str]:
    """The automaton patterns for one phrase: composed and decomposed spellings, folded.

    In whole-word mode each pattern is wrapped in separators (text start and end count as one).
    Returns an empty list when nothing of the phrase remains after normalisation.
    """
    variants: list[str] = []
    for form in (phrase, unicodedata.normalize("NFD", phrase)):
        folded = fold_text(form, casefold)
        if whole_word:
            core = to_word_stream(folded).strip(SEPARATOR)
            pattern = f"{SEPARATOR}{core}{SEPARATOR}" if core else ""
        else:
            pattern = folded
        if pattern and pattern not in variants:
            variants.append(pattern)
    return variants


def matches_text(phrase: str, text: str, whole_word: bool, casefold: bool = True) -> bool:
    """Reference check on a whole text (tests, final safety net): does ``text`` contain ``phrase``?"""
    folded = fold_text(text, casefold)
    if whole_word:
        folded = SEPARATOR + to_word_stream(folded) + SEPARATOR
    return any(variant in folded for variant in phrase_variants(phrase, whole_word, casefold))
