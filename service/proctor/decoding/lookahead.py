"""Forbidden phrases under a constraint: do not walk into a branch whose every way out completes a phrase.

The per-step mask only removes the token that would *complete* a phrase. Under a constraint that
is not enough: with ``choice: ["an APPLE tart", "cherry cake"]`` and ``apple`` forbidden, the
model may start " an AP…" and then find every continuation banned. So for rows that have both a
constraint and forbidden phrases, the chosen token is checked first: a depth-first search from
the state after it (the constraint's matcher advanced and rolled back, the phrase automaton
stepped) looks for any way to continue for ``DEPTH`` tokens or to end. A token with none is
removed and the row chooses again.

The search is bounded (``NODES`` states per check). When the bound is hit it gives the token the
benefit of the doubt: the mask still guarantees the phrase never appears, the request may then
end with FORBIDDEN_PHRASE instead of finding the other branch.
"""

from __future__ import annotations

from proctor.constraints.backend import Matcher, allocate_bitmask, bitmask_to_bool
from proctor.decoding.forbidden import ForbiddenTracker
from proctor.decoding.forbidden.index import ForbiddenIndex, State

DEPTH = 8
NODES = 256


class DeadEndSearch:
    """One per pipeline call; reuses its scratch bitmask."""

    def __init__(self, vocab_size: int) -> None:
        self._vocab = vocab_size
        self._scratch = allocate_bitmask(1, vocab_size)
        self.phrase = ""  # a phrase that blocked some branch in the last check (names a dead end)

    def viable(self, matcher: Matcher, tracker: ForbiddenTracker, token_id: int) -> bool:
        index = tracker.index
        state, phrase = index.advance(tracker.state, token_id)
        if phrase is not None:
            self.phrase = phrase
            return False
        if not matcher.advance(token_id):
            return False
        try:
            return self._search(matcher, index, state, DEPTH, [NODES])
        finally:
            matcher.rollback(1)

    def _search(self, matcher: Matcher, index: ForbiddenIndex, state: State, depth: int, budget: list[int]) -> bool:
        if matcher.can_end() and index.end_blocked(state) is None:
            return True
        if depth <= 0 or budget[0] <= 0:
            return True  # no dead end found within the bound
        budget[0] -= 1
        for token_id in self._allowed(matcher, index, state):
            following, phrase = index.advance(state, token_id)
            if phrase is not None or not matcher.advance(token_id):
                continue
            try:
                if self._search(matcher, index, following, depth - 1, budget):
                    return True
            finally:
                matcher.rollback(1)
            if budget[0] <= 0:
                return True
        return False

    def _allowed(self, matcher: Matcher, index: ForbiddenIndex, state: State) -> list[int]:
        self._scratch.fill_(-1)
        matcher.fill_bitmask(self._scratch, 0)
        allowed = bitmask_to_bool(self._scratch, self._vocab)[0]
        ban = index.banned(state)
        remaining = allowed & ~ban.base
        if ban.extra.numel():
            remaining[ban.extra] = False
        if not bool(remaining.any()) and bool(allowed.any()):
            blocked = int(allowed.nonzero()[0])
            self.phrase = index.advance(state, blocked)[1] or self.phrase
        return remaining.nonzero().flatten().tolist()
