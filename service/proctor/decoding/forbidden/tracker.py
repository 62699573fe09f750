"""Per-request forbidden-phrase state: where the output text stands in the phrase automaton."""

from __future__ import annotations

from proctor.decoding.forbidden.index import BanSet, ForbiddenIndex


class ForbiddenTracker:
    """Advanced by the engine after each sampled token; read by the pipeline before sampling."""

    def __init__(self, index: ForbiddenIndex) -> None:
        self.index = index
        self.state = index.initial

    def banned(self, last_step: bool = False) -> BanSet:
        return self.index.banned(self.state, last_step)

    def end_blocked(self) -> str | None:
        """The phrase that ending the output now would complete (whole-word mode only)."""
        return self.index.end_blocked(self.state)

    def would_complete(self, token_id: int) -> str | None:
        """The phrase ``token_id`` would complete from here (names the phrase at a dead end)."""
        return self.index.advance(self.state, token_id)[1]

    def advance(self, token_id: int) -> str | None:
        """Read a committed token; returns a phrase only if the mask was bypassed (an engine bug)."""
        self.state, phrase = self.index.advance(self.state, token_id)
        return phrase
