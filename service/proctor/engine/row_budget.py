"""A request's budget: how many tokens its output may hold, and how a JSON output ends within them.

Two facts, one home each: the ``OutputBudget`` (domain/output_budget.py: at least, at most and left, resolved once
before the request runs) and, for a JSON-schema row with ``close_at_budget``, the closing rule (engine/closing.py's
``ClosingRule``, used here through its public face only). This part decides, after each token, whether the output
must now end with its shortest valid ending; the row's decoding state (engine/row_decoding.py) then forces that
ending's tokens. Nothing here draws from the generator, so a replay takes the same decisions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proctor.domain import FinishReason
from proctor.domain.output_budget import OutputBudget

if TYPE_CHECKING:
    from proctor.constraints.backend import Matcher
    from proctor.engine.closing import ClosingRule

Ending = tuple[int, ...]  # tokens to force from the next position on (empty: nothing to force)
Verdict = tuple[FinishReason | None, str, Ending]  # the finish reason and detail after the rule, and an ending
_CLOSABLE = (None, FinishReason.LENGTH, FinishReason.CONSTRAINT_COMPLETE)


class RowBudget:
    """One row's output budget and, when it has one, its closing rule (``rule``) over its matcher."""

    def __init__(self, output: OutputBudget, rule: ClosingRule | None = None, matcher: Matcher | None = None) -> None:
        if rule is not None and matcher is None:
            raise ValueError("a closing rule needs the row's matcher")
        self.output = output
        self.rule = rule
        self._matcher = matcher

    def opening(self) -> Ending:
        """The ending to force from the first token: a budget too tight for even one free token (else empty)."""
        if self.rule is None:
            return ()
        return self.rule.plan(0, self.output.left(0)) or ()

    def after(self, piece: str, generated: int, reason: FinishReason | None, detail: str) -> Verdict:
        """After a token whose text is ``piece`` (``generated`` tokens so far, the token rules' ``reason``): close
        the JSON when the tokens left come within its ending (or it loops). The ending's tokens become forced steps;
        the row ends CLOSED_AT_BUDGET with its last one."""
        rule, matcher = self.rule, self._matcher
        if rule is None or matcher is None:
            return reason, detail, ()
        rule.push(piece)
        most = self.output.max_new_tokens
        if rule.closing:
            if generated >= rule.closes_at and reason in _CLOSABLE and matcher.can_end():
                return FinishReason.CLOSED_AT_BUDGET, rule.detail(most), ()
            return ((None, "", ()) if reason is FinishReason.REPETITION  # an ending may repeat
                    else (reason, detail, ()))
        if reason is FinishReason.LENGTH and rule.complete and matcher.can_end():  # it closed itself, at the end
            return FinishReason.CONSTRAINT_COMPLETE, f"the JSON is complete at max_new_tokens {most}", ()
        if reason is not None and reason is not FinishReason.REPETITION:
            return reason, detail, ()
        ending = rule.plan(generated, self.output.left(generated), now=reason is FinishReason.REPETITION)
        if ending is None:
            return reason, detail, ()
        if not ending:  # complete as it stands (a number that could go on): it ends here
            return FinishReason.CLOSED_AT_BUDGET, rule.detail(most), ()
        return None, "", ending

    def closing_draft(self, generated: int, limit: int) -> list[int]:
        """The ending's tokens still to come but the last (each verified by the one before it), up to ``limit``."""
        rule = self.rule
        if rule is None or not rule.closing:
            return []
        start = rule.closes_at - len(rule.closing)  # the output length at which the ending began
        return list(rule.closing[generated - start:min(rule.closes_at - 1, generated + limit) - start])

    def forced(self, generated: int) -> int:
        """How many of the output's ``generated`` tokens the ending forced (``usage.closing_tokens``)."""
        return self.rule.forced(generated) if self.rule is not None else 0
