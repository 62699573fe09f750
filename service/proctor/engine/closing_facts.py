"""What closing a constraint's outputs within their budget costs, computed once per compiled constraint
(engine/closing.py).

The shortest valid output's tokens (a ``max_new_tokens`` below it is refused up front) and the margin: the most one
more free token can add to an ending anywhere in an output (the longest of the output rule's growth texts, a JSON
schema's member or item at its shortest, tokenized, plus ``MARGIN_EXTRA``); a row near its budget keeps the margin
of where it stands (``margin_of`` its reader's growth texts), which this one bounds. A free token is taken only
while the ending still fits after it, whatever it opens. The texts come from the constraint's output rule
(constraints/output_rule.py); the tokens and the matcher's say are the engine's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proctor.constraints.forced import accepted_prefix

if TYPE_CHECKING:
    from proctor.constraints.backend import Matcher
    from proctor.constraints.output_rule import OutputRule
    from proctor.constraints.service import PreparedConstraint

MARGIN_EXTRA = 2  # tokens beyond the longest member or item one token can open (a separator, a quote)
FACTS_CACHED = 256  # constraints whose facts are kept (a few tokenizations and a matcher walk each)


@dataclass(frozen=True, slots=True)
class ClosingFacts:
    """What closing a constraint's outputs costs, computed once per compiled constraint."""

    rule: OutputRule  # the output rule of what the matcher enforces (the compiled constraint)
    minimum: int  # tokens of the shortest valid output (0: the closer does not cover the schema's start)
    shortest: str  # that output's text
    margin: int  # the most one more free token can add to an ending's tokens (its longest member or item)


class ClosingFactsCache:
    """``ClosingFacts`` per compiled constraint (its spec's hash), kept for the last ``FACTS_CACHED``."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._facts: OrderedDict[str, ClosingFacts] = OrderedDict()
        self._lock = threading.Lock()  # prepare runs on the callers' worker threads

    def facts(self, constraint: PreparedConstraint) -> ClosingFacts:
        key = constraint.summary.spec_sha256
        with self._lock:
            found = self._facts.get(key)
            if found is not None:
                self._facts.move_to_end(key)
                return found
        if constraint.output_rule is None:
            raise ValueError("the constraint has no output rule: its outputs cannot be closed within a budget")
        found = closing_facts(constraint.output_rule, constraint.compiled.new_matcher(), self._tokenizer,
                             self._vocab_size)
        with self._lock:
            self._facts[key] = found
            while len(self._facts) > FACTS_CACHED:
                self._facts.popitem(last=False)
        return found


def closing_facts(rule: OutputRule, matcher: Matcher, tokenizer: Any, vocab_size: int) -> ClosingFacts:
    """The facts of ``rule`` (``matcher``: a fresh one of its compiled constraint)."""
    minimum, shortest = 0, ""
    for text in rule.reader().endings():
        ids = encode(tokenizer, text)
        if accepts(matcher, ids, vocab_size):
            minimum, shortest = len(ids), text
            break
    return ClosingFacts(rule, minimum, shortest, margin_of(rule.growth_texts(), tokenizer))


def margin_of(texts: list[str], tokenizer: Any, counted: dict[str, int] | None = None) -> int:
    """The most one more free token can add to an ending where ``texts`` are what it can begin: the longest of
    them (the four longest in characters, tokenized; ``counted``: their token counts kept between calls), plus
    ``MARGIN_EXTRA``."""
    most = 0
    for text in sorted(texts, key=len, reverse=True)[:4]:
        found = counted.get(text) if counted is not None else None
        if found is None:
            found = len(encode(tokenizer, text))
            if counted is not None:
                counted[text] = found
        most = max(most, found)
    return most + MARGIN_EXTRA


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def accepts(matcher: Matcher, ids: list[int], vocab_size: int) -> bool:
    """Whether the constraint takes ``ids`` from the matcher's state and may end after them (state unchanged)."""
    if len(accepted_prefix(matcher, ids, vocab_size)) != len(ids):
        return False
    advanced = 0
    try:
        for token in ids:
            if not matcher.advance(token):
                return False
            advanced += 1
        return matcher.can_end()
    finally:
        if advanced:
            matcher.rollback(advanced)
