"""The tokens a constraint forces next: where it allows exactly one token, and then the next, and so on.

Jump-forward (engine/drafting.py) drafts them, so a run of keys, punctuation, enum tails and ``const`` values
is verified in one forward instead of one step each. An engine with a forced-token API answers itself
(llguidance's ``compute_ff_tokens``, through the matcher's ``forced_tokens``); for the others the mask says
it: a single allowed token is forced. Either way the matcher is left where it was.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from proctor.constraints.backend import Matcher, allocate_bitmask


def forced_tokens(matcher: Matcher, limit: int, vocab_size: int) -> list[int]:
    """Up to ``limit`` tokens the constraint forces from the matcher's current state (the matcher is unchanged)."""
    own = getattr(matcher, "forced_tokens", None)
    if own is not None:
        return list(own(limit)) if limit > 0 else []
    return _walk(matcher, limit, vocab_size, lambda words, _: single_allowed(words))


def accepted_prefix(matcher: Matcher, tokens: list[int], vocab_size: int) -> list[int]:
    """The longest prefix of ``tokens`` the constraint accepts from here (the matcher is unchanged): a looked-up
    draft is cut where the grammar would reject it, so no forward computes a position that cannot be kept."""
    own = getattr(matcher, "valid_prefix", None)
    if own is not None:
        return tokens[:own(tokens)]

    def allowed(words: torch.Tensor, index: int) -> int | None:
        token = tokens[index]
        return token if 0 <= token < vocab_size and (int(words[token // 32]) >> (token % 32)) & 1 else None

    return _walk(matcher, len(tokens), vocab_size, allowed)


def _walk(matcher: Matcher, limit: int, vocab_size: int,
          choose: Callable[[torch.Tensor, int], int | None]) -> list[int]:
    """Advance the matcher by up to ``limit`` tokens, each ``choose``n from its mask and the tokens so far (None
    ends the walk), then roll it back. A token is advanced only once its mask allows it: an engine may not
    survive a rejected ``advance``."""
    bitmask = allocate_bitmask(1, vocab_size)
    tokens: list[int] = []
    try:
        while len(tokens) < limit and not matcher.must_end():
            matcher.fill_bitmask(bitmask, 0)
            token = choose(bitmask[0], len(tokens))
            if token is None or not 0 <= token < vocab_size or not matcher.advance(token):
                break
            tokens.append(token)
    finally:
        if tokens:
            matcher.rollback(len(tokens))
    return tokens


def single_allowed(words: torch.Tensor) -> int | None:
    """The one token a bitmask row allows (32 tokens per int32 word), or None when it allows more or none."""
    set_words = torch.nonzero(words).flatten()
    if set_words.numel() != 1:
        return None
    index = int(set_words[0])
    word = int(words[index]) & 0xFFFFFFFF
    if word & (word - 1):
        return None
    return index * 32 + word.bit_length() - 1
