"""Valid within the budget: a JSON output running short of tokens is ended with its shortest valid ending (issue 45).

Every step a JSON-schema row knows what finishing would cost: ``JsonCloser`` (constraints/json_closer.py) reads
its output and says the shortest texts that end it validly. When the tokens left (``max_new_tokens``, capped by
the context) come within that cost plus the most one more free token could add to it (``BudgetFacts.margin``),
the row stops generating freely: the first ending the matcher accepts to an accepting state becomes forced
tokens (sequence.py plans each as a forced step; engine/drafting.py drafts them, so the ending is verified in
one forward), and the row ends ``CLOSED_AT_BUDGET`` with ``usage.closing_tokens`` saying how many were forced.
The repetition detector closes the same way instead of ending the row invalid.

Nothing here draws from the generator and every decision follows from the request and the tokens so far, so a
replay takes the same decisions. Before a request runs, a ``max_new_tokens`` below the shortest valid output
is refused (INVALID_ARGUMENT naming it and the minimum). Grammars and regexes are not covered: no engine says
how far its state is from an accepting one, and a shortest path over their automata is not offered by them.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proctor.constraints.forced import accepted_prefix
from proctor.constraints.json_closer import JsonCloser, growth_texts
from proctor.domain import RequestValidationError

if TYPE_CHECKING:
    from proctor.constraints.backend import Matcher
    from proctor.constraints.service import PreparedConstraint
    from proctor.engine.preprocess import PreparedRequest

MARGIN_EXTRA = 2  # tokens beyond the longest member or item one token can open (a separator, a quote)
FACTS_CACHED = 256  # schemas whose facts are kept (a few tokenizations and a matcher walk each)


@dataclass(frozen=True, slots=True)
class BudgetFacts:
    """What closing a schema's outputs costs, computed once per compiled schema."""

    schema: Any  # the schema the matcher enforces (the compiled one)
    minimum: int  # tokens of the shortest valid output (0: the closer does not cover the schema's start)
    shortest: str  # that output's text
    margin: int  # the most one more free token can add to an ending's tokens (its longest member or item)


class BudgetFactsCache:
    """``BudgetFacts`` per compiled schema (its spec's hash), kept for the last ``FACTS_CACHED``."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._facts: OrderedDict[str, BudgetFacts] = OrderedDict()
        self._lock = threading.Lock()  # prepare runs on the callers' worker threads

    def facts(self, constraint: PreparedConstraint) -> BudgetFacts:
        key = constraint.summary.spec_sha256
        with self._lock:
            found = self._facts.get(key)
            if found is not None:
                self._facts.move_to_end(key)
                return found
        schema: Any = constraint.compiled.spec.schema
        matcher = constraint.compiled.new_matcher()
        minimum, shortest = 0, ""
        for text in JsonCloser(schema).endings():
            ids = encode(self._tokenizer, text)
            if accepts(matcher, ids, self._vocab_size):
                minimum, shortest = len(ids), text
                break
        longest = sorted(growth_texts(schema), key=len, reverse=True)[:4]
        margin = max((len(encode(self._tokenizer, text)) for text in longest), default=0) + MARGIN_EXTRA
        found = BudgetFacts(schema, minimum, shortest, margin)
        with self._lock:
            self._facts[key] = found
            while len(self._facts) > FACTS_CACHED:
                self._facts.popitem(last=False)
        return found


def attach_budget(prepared: PreparedRequest, cache: BudgetFactsCache) -> PreparedRequest:
    """The prepared request with its budget facts (a JSON schema, one sequence, ``close_at_budget`` on); refused
    when ``max_new_tokens`` cannot hold the schema's shortest valid output."""
    request, constraint = prepared.request, prepared.constraint
    if constraint is None or constraint.schema is None or not request.stopping.close_at_budget \
            or request.sampling.num_beams > 1:
        return prepared
    facts = cache.facts(constraint)
    if facts.minimum > prepared.max_new_tokens:
        capped = f" (capped by the context: {prepared.length_detail})" if prepared.length_detail else ""
        raise RequestValidationError.single(
            "stopping.max_new_tokens",
            f"{prepared.max_new_tokens} tokens{capped} cannot hold the schema's shortest valid output, "
            f"{facts.minimum} tokens ({_clip(facts.shortest)}): ask for at least {facts.minimum}")
    return dataclasses.replace(prepared, budget=facts)


class BudgetRule:
    """One row's closer and the ending it was given (``closing``: the forced tokens, once it closes)."""

    def __init__(self, facts: BudgetFacts, matcher: Matcher, tokenizer: Any, vocab_size: int) -> None:
        self._facts = facts
        self._matcher = matcher
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._closer = JsonCloser(facts.schema)
        self.closing: tuple[int, ...] = ()
        self.closes_at = -1  # the output length at which the ending is complete
        self.after_loop = False  # it closed because the output looped, not for the budget

    def push(self, piece: str) -> None:
        self._closer.push(piece)

    @property
    def complete(self) -> bool:
        """The output is a complete JSON value (the closer's reading)."""
        return self._closer.done

    def plan(self, generated: int, left: int, *, now: bool = False) -> tuple[int, ...] | None:
        """The ending to force from here when it is time (``left`` tokens left, ``now``: close whatever is left,
        the output looped), else None. An ending is kept only when the matcher accepts it to an accepting
        state."""
        if self.closing:
            return None
        endings = self._closer.endings()
        if not endings or not endings[0]:
            return None
        margin = self._facts.margin
        if not now and len(endings[0].encode("utf-8")) + margin < left:  # far: a token is at least a byte
            return None
        for text in endings:
            ids = encode(self._tokenizer, text)
            if not now and len(ids) + margin < left:
                return None  # not yet: the shortest ending fits with room for another free token
            if len(ids) <= left and accepts(self._matcher, ids, self._vocab_size):
                self.closing, self.closes_at, self.after_loop = tuple(ids), generated + len(ids), now
                return self.closing
        return None

    def detail(self, max_new_tokens: int) -> str:
        why = "the output looped" if self.after_loop else f"max_new_tokens {max_new_tokens} was near"
        return f"closed at the budget: {why}, so the last {len(self.closing)} tokens end the JSON validly"


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


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
