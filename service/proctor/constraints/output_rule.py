"""What the engine asks of a constraint to end an output validly within its token budget: the output rule.

The engine's budget rule (engine/closing.py) asks, in text: from the output written so far, the shortest texts that
end it validly (from the empty output, those are the shortest valid outputs: a budget below them is refused); and
the texts one more free token can begin, which an ending would then have to finish (the longest of them, tokenized,
is the margin it keeps): the rule's, anywhere in an output (a bound, for the rows far from their budget), and the
reader's, from where its output stands (the margin a row near its budget keeps, issue 56). The tokens are the
engine's: it tokenizes each text and keeps the first its matcher accepts to an accepting state, so a rule that reads
a constraint differently from the engine costs a candidate, never a wrong output.

A constraint whose kind can answer provides an ``OutputRule`` with its compiled form (``PreparedConstraint``,
constraints/service.py); JSON Schema's is constraints/json_schema/rule.py, the tool-call grammar's
constraints/tool_calls.py. The engine sees only this protocol, so
it knows no JSON Schema and another kind can join without touching it.
"""

from __future__ import annotations

from typing import Protocol


class OutputReader(Protocol):
    """One output, read as it is written (one per row: it keeps where the output stands)."""

    @property
    def done(self) -> bool:
        """The output is complete as it stands: nothing is left to end."""

    @property
    def repeated(self) -> str:
        """What the output just repeated of itself, whole (a tool call the same as an earlier one): it should end
        where it stands; ``""`` otherwise."""

    def push(self, text: str) -> None:
        """Read the output's next piece."""

    def endings(self) -> list[str]:
        """The texts that end the output validly from here, shortest first: ``[]`` when the rule cannot tell (the
        row runs on as without it), ``[""]`` when the output is complete and may end where it is."""

    def growth_texts(self) -> list[str]:
        """The texts one more free token can begin from here and an ending must then finish: a part of the rule's
        ``growth_texts``."""


class OutputRule(Protocol):
    """What ending an output of one compiled constraint costs, in text (shared by every row of that constraint)."""

    def reader(self) -> OutputReader:
        """A reader at the empty output: its ``endings()`` are the shortest valid outputs."""

    def growth_texts(self) -> list[str]:
        """The texts one more free token can begin and an ending must then finish (a member, an item, at their
        shortest): the longest of them bounds what one token can add to an ending's cost."""
