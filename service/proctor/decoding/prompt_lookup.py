"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of a row's last few tokens.

Outputs copy their inputs (party names, dates and clause titles from the prompt, and from themselves), so
the tokens that followed the last time these n tokens appeared are a cheap guess at what follows now
(prompt-lookup decoding, as vLLM's n-gram proposer and llama.cpp's lookup do). The engine verifies every
guess (engine/drafting.py), so a wrong one costs a row of compute and never a changed token.
"""

from __future__ import annotations

LOOKUP_SIZES = (3, 2)  # n-gram lengths matched, longest first


class PromptLookup:
    """Where each n-gram of a row's tokens (prompt, then output) last occurred with a token after it."""

    def __init__(self, prompt: list[int]) -> None:
        self._tokens = list(prompt)
        self._prompt_length = len(prompt)
        self._after: dict[tuple[int, ...], int] = {}  # n-gram -> position of the token that followed it
        self._indexed = 0  # n-grams ending before this position are indexed

    def draft(self, generated: list[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the latest earlier occurrence of the row's last n tokens."""
        tokens = self._tokens
        tokens.extend(generated[len(tokens) - self._prompt_length:])
        end = len(tokens)
        for position in range(self._indexed, end - 1):  # every n-gram that now has a token after it
            for size in LOOKUP_SIZES:
                if position + 1 >= size:
                    self._after[tuple(tokens[position + 1 - size:position + 1])] = position + 1
        self._indexed = max(self._indexed, end - 1)
        for size in LOOKUP_SIZES:
            if end >= size:
                after = self._after.get(tuple(tokens[end - size:]))
                if after is not None:
                    return tokens[after:after + limit]
        return []
