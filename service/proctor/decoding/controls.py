"""Per-request generation controls: forced tokens, must-include phrases, the confidence summary.

The engine's sequence state builds these only for a request that uses them, so a request that
does not pays nothing per step. Forced tokens and the must-include end ban are per-step
processors (named in ``removed_by``) that run after the request's own processors, with the masks
applied again after them (the order is written in ``pipeline.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from proctor.domain import Confidence, PhraseInclusion

NEG_INF = float("-inf")


class ForceToken:
    """Processor: every token but one is removed. A token the masks removed stays removed, so the row
    is left with nothing (a dead end, reported by the sequence) instead of producing it."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id

    def __call__(self, logits: torch.Tensor) -> None:
        kept = logits[self.token_id].clone()
        logits.fill_(NEG_INF)
        logits[self.token_id] = kept


class EndBan:
    """Processor: end-of-sequence and stop tokens are removed, unless nothing else is left (the constraint
    or another mask allows only the end): then the end stands and the missing phrase is reported."""

    def __init__(self, end_ids: Sequence[int], device: torch.device) -> None:
        self.ids = torch.tensor(list(end_ids), dtype=torch.long, device=device)

    def __call__(self, logits: torch.Tensor) -> None:
        if not self.ids.numel():
            return
        kept = logits[self.ids].clone()
        logits[self.ids] = NEG_INF
        if bool(torch.isneginf(logits.amax())):
            logits[self.ids] = kept


class PhraseTracker:
    """Which ``must_include`` phrases the decoded text contains so far (each new piece is searched
    together with the phrase's length of text before it, so a phrase spanning pieces is found)."""

    def __init__(self, phrases: Iterable[str]) -> None:
        self.phrases = tuple(phrases)
        self._missing = list(dict.fromkeys(self.phrases))
        self._tail = ""
        self._keep = max((len(p) for p in self.phrases), default=1) - 1

    @property
    def missing(self) -> bool:
        return bool(self._missing)

    def push(self, piece: str) -> None:
        if not piece or not self._missing:
            return
        window = self._tail + piece
        self._missing = [p for p in self._missing if p not in window]
        self._tail = window[-self._keep:] if self._keep else ""

    def results(self, text: str) -> tuple[PhraseInclusion, ...]:
        """Each phrase, in request order, and whether the returned ``text`` includes it (a stop string's
        match is cut from the text, so a phrase inside it is not included)."""
        return tuple(PhraseInclusion(p, p in text) for p in self.phrases)


class ConfidenceStats:
    """Running mean and minimum of the chosen token's final probability and the raw top-2 gap."""

    __slots__ = ("gap_min", "gap_sum", "prob_min", "prob_sum", "tokens")

    def __init__(self) -> None:
        self.tokens = 0
        self.prob_sum = self.gap_sum = 0.0
        self.prob_min = self.gap_min = math.inf

    def add(self, final_logprob: float, alternatives: Sequence[tuple[int, float]]) -> None:
        """One chosen token; ``alternatives``: the raw distribution's best tokens, best first (two at least)."""
        probability = math.exp(final_logprob)
        gap = math.exp(alternatives[0][1]) - math.exp(alternatives[1][1]) if len(alternatives) > 1 else 1.0
        self.tokens += 1
        self.prob_sum += probability
        self.gap_sum += gap
        self.prob_min = min(self.prob_min, probability)
        self.gap_min = min(self.gap_min, gap)

    def summary(self) -> Confidence:
        if not self.tokens:
            return Confidence(0, 0.0, 0.0, 0.0, 0.0)
        return Confidence(self.tokens, self.prob_sum / self.tokens, self.prob_min,
                          self.gap_sum / self.tokens, self.gap_min)
