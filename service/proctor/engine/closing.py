"""Valid within the budget: a JSON output running short of tokens is ended with its shortest valid ending (issue 45).

Every step a JSON-schema (or tool-call) row knows what finishing would cost: its output rule
(constraints/output_rule.py) reads its output and says the shortest texts that end it validly. When the tokens left
(``max_new_tokens``, capped by the context) come within that cost plus the most one more free token could add to it
(``ClosingFacts.margin``), the row stops generating freely: the first ending the matcher accepts to an accepting
state becomes forced tokens (sequence.py plans each as a forced step; engine/drafting.py drafts them, so the ending
is verified in one forward), and the row ends ``CLOSED_AT_BUDGET`` with ``usage.closing_tokens`` saying how many
were forced. The repetition detector closes the same way instead of ending the row invalid.

The margin a row keeps near its budget is the one of where its output stands (its reader's growth texts: what
one more token can begin from there, a member deeper in a recursive schema, another tool-call block), bounded by
the constraint's (``ClosingFacts.margin``, which the far rows use to skip reading endings). An output that
repeats a whole part of itself (a tool call the same as an earlier one, constraints/tool_calls.py) ends there.

Nothing here draws from the generator and every decision follows from the request and the tokens so far, so a
replay takes the same decisions. Before a request runs, a ``max_new_tokens`` below the shortest valid output
is refused (INVALID_ARGUMENT naming it and the minimum). The JSON of tool-call blocks is covered through their
grammar's output rule; other grammars and regexes are not: no engine says how far its state is from an
accepting one, and a shortest path over their automata is not offered by them.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from proctor.engine.closing_facts import ClosingFacts, ClosingFactsCache, accepts, encode, margin_of

if TYPE_CHECKING:
    from proctor.constraints.backend import Matcher
    from proctor.constraints.output_rule import OutputReader
    from proctor.engine.preprocess import PreparedRequest

log = logging.getLogger("proctor.engine")

def attach_closing(prepared: PreparedRequest, cache: ClosingFactsCache) -> PreparedRequest:
    """The prepared request with its closing facts (a JSON schema, one sequence, ``close_at_budget`` on); refused
    when ``max_new_tokens`` cannot hold the schema's shortest valid output."""
    request, constraint = prepared.request, prepared.constraint
    if constraint is None or constraint.output_rule is None or not request.stopping.close_at_budget \
            or request.sampling.num_beams > 1:
        return prepared
    try:
        facts = cache.facts(constraint)
    except Exception:  # the closer's reading of a schema failed: served without the rule, never refused for it
        log.exception("closing facts of %s failed; served without close_at_budget", constraint.summary.spec_sha256)
        return prepared
    least, thought = facts.minimum, ""
    if prepared.thought is not None:  # the section's markers come before the answer
        overhead = prepared.thought.overhead
        least, thought = least + overhead, f" after the thought's {overhead} marker tokens"
    prepared.output_budget.require(least, f"the schema's shortest valid output, {facts.minimum} tokens "
                                          f"({_clip(facts.shortest)}){thought}")
    return dataclasses.replace(prepared, closing=facts)


class ClosingRule:
    """One row's closer and the ending it was given (``closing``: the forced tokens, once it closes)."""

    def __init__(self, facts: ClosingFacts, matcher: Matcher, tokenizer: Any, vocab_size: int,
                 reader: OutputReader | None = None) -> None:
        self._facts = facts
        self._matcher = matcher
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._closer = reader if reader is not None else facts.rule.reader()  # (a thinking row's: thought_gate.py)
        self.closing: tuple[int, ...] = ()
        self.closes_at = -1  # the output length at which the ending is complete (-1: not closing)
        self.after_loop = False  # it closed because the output looped, not for the budget
        self.repeated = ""  # it ended because the output repeated this of itself (a tool call)
        self.failed = False  # the closer raised: the rule is off for this row
        self._quiet_until = 0  # the output length before which the ending cannot come within reach (far)
        self._counted: dict[str, int] = {}  # growth texts' token counts (the margin where the row stands)

    def push(self, piece: str) -> None:
        if not self.failed:
            try:
                self._closer.push(piece)
            except Exception:
                self._fail()

    def _fail(self) -> None:
        """The closer is a reading of the schema, not the engine's: should it fail, this row runs on without the
        rule (as with ``close_at_budget`` off) and every other row is unaffected."""
        log.exception("the budget closer failed; this row goes on without it")
        self.failed = True

    @property
    def complete(self) -> bool:
        """The output is a complete JSON value (the closer's reading)."""
        return self._closer.done

    def plan(self, generated: int, left: int, *, now: bool = False) -> tuple[int, ...] | None:
        """The ending to force from here when it is time (``left`` tokens left, ``now``: close whatever is left,
        the output looped), else None. An ending is kept only when the matcher accepts it to an accepting
        state."""
        if self.closes_at >= 0 or self.failed:
            return None
        try:
            repeated = self._closer.repeated
            if repeated and self._matcher.can_end():  # a whole call again: the output ends where it stands
                self.closes_at, self.after_loop, self.repeated = generated, True, repeated
                return ()
            if generated < self._quiet_until and not now:
                return None
            return self._plan(generated, left, now)
        except Exception:
            self._fail()
            return None

    def _plan(self, generated: int, left: int, now: bool) -> tuple[int, ...] | None:
        endings = self._closer.endings()
        if not endings or self._closer.done:  # nothing the closer can tell, or complete: the row ends by itself
            return None
        bound = self._facts.margin  # the most one free token adds anywhere
        reach = len(endings[0].encode("utf-8")) + bound  # a token is at least a byte: a bound of the ending's tokens
        if not now and reach < left:
            # Far: one free token adds at most ``bound`` tokens to the ending (what the margin is), so it cannot come
            # within reach for the next ceil((left - reach) / (bound + 1)) tokens; the closer only reads them.
            self._quiet_until = generated - (reach - left) // (bound + 1)
            return None
        margin = margin_of(self._closer.growth_texts(), self._tokenizer, self._counted)  # from where it stands
        if not endings[0]:  # a value that may go on (a number) and is valid as it stands: it ends here when due
            if (now or left <= margin) and self._matcher.can_end():
                self.closes_at, self.after_loop = generated, now
                return ()
            return None
        for text in endings:
            ids = encode(self._tokenizer, text)
            if not now and len(ids) + margin < left:
                return None  # not yet: the shortest ending fits with room for another free token
            if len(ids) <= left and accepts(self._matcher, ids, self._vocab_size):
                self.closing, self.closes_at, self.after_loop = tuple(ids), generated + len(ids), now
                return self.closing
        return None

    def forced(self, generated: int) -> int:
        """How many of the output's ``generated`` tokens the ending forced (it may be cut short by a stop)."""
        start = self.closes_at - len(self.closing)
        return max(0, min(len(self.closing), generated - start)) if self.closing else 0

    def detail(self, max_new_tokens: int) -> str:
        if self.repeated:
            return f"closed where the output repeats itself: {self.repeated}, so it ends there"
        why = "the output looped" if self.after_loop else f"max_new_tokens {max_new_tokens} was near"
        if not self.closing:
            return f"closed at the budget: {why}, and the output was a complete value: it ends there"
        return f"closed at the budget: {why}, so the last {len(self.closing)} tokens end the JSON validly"


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
