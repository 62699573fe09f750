"""Aho–Corasick over normalised phrase patterns, one character at a time.

A state is the longest suffix of the text read so far that is a prefix of some pattern, so the
state alone decides every future match: that is what lets ``index`` cache one token mask per
state. Transitions are memoised per state, so a long generation costs one dict lookup per
character once warm.
"""

from __future__ import annotations

from collections import deque

from proctor.decoding.forbidden.normalize import SEPARATOR

ROOT = 0
NO_MATCH = -1


class PhraseAutomaton:
    """Patterns → deterministic matcher. ``step`` returns (next state, matched pattern or -1)."""

    def __init__(self, patterns: list[str], *, collapse_separators: bool) -> None:
        self.patterns = patterns
        self._collapse = collapse_separators
        goto: list[dict[str, int]] = [{}]
        self.depth = [0]
        self.last_char = [""]
        ends: list[int] = [NO_MATCH]
        for number, pattern in enumerate(patterns):
            state = ROOT
            for ch in pattern:
                nxt = goto[state].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[state][ch] = nxt
                    goto.append({})
                    self.depth.append(self.depth[state] + 1)
                    self.last_char.append(ch)
                    ends.append(NO_MATCH)
                state = nxt
            if ends[state] == NO_MATCH:
                ends[state] = number
        self._goto = goto
        self._fail = [ROOT] * len(goto)
        # out[s]: a pattern ending at s itself or at any state on its failure chain.
        self._out = list(ends)
        queue = deque(goto[ROOT].values())
        while queue:
            state = queue.popleft()
            for ch, child in goto[state].items():
                fallback = self._fail[state]
                while fallback != ROOT and ch not in goto[fallback]:
                    fallback = self._fail[fallback]
                target = goto[fallback].get(ch, ROOT)
                self._fail[child] = target if target != child else ROOT
                if self._out[child] == NO_MATCH:
                    self._out[child] = self._out[self._fail[child]]
                queue.append(child)
        self._delta: list[dict[str, tuple[int, int]]] = [{} for _ in goto]

    def step(self, state: int, ch: str) -> tuple[int, int]:
        """Read one normalised character."""
        cached = self._delta[state].get(ch)
        if cached is not None:
            return cached
        if self._collapse and ch == SEPARATOR and self.last_char[state] == SEPARATOR:
            result = (state, NO_MATCH)
        else:
            current = state
            while current != ROOT and ch not in self._goto[current]:
                current = self._fail[current]
            nxt = self._goto[current].get(ch, ROOT)
            result = (nxt, self._out[nxt])
        self._delta[state][ch] = result
        return result
