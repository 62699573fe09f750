"""The constraint after the thought: a matcher and an output rule that let the section through first (issue 56).

vLLM applies the grammar only once the reasoning parser saw the end of the thought; so does ``ThoughtGate``: while
the row is before or in its section every token is allowed but the end of the output (the answer must follow), and
from the token after the end marker the constraint's own matcher decides. It keeps its own reading of the markers
(token ids, as ``ThoughtSection`` does) because the forbidden-phrase lookahead and the closing rule try tokens on
it and take them back (``rollback``).

``ThoughtRule`` is the same for the budget's closing rule (engine/closing.py): during the thought the shortest
valid ending is the end marker and the answer's shortest output, so a thought that runs long is ended in time for
the answer to close valid; in the answer the constraint's own rule reads the answer's text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from proctor.constraints.forced import accepted_prefix, forced_tokens
from proctor.engine.thought import Phase, ThoughtPlan, ThoughtSection

if TYPE_CHECKING:
    from proctor.constraints.backend import Matcher
    from proctor.constraints.output_rule import OutputReader, OutputRule


class ThoughtGate:
    """``inner`` (the constraint's matcher) behind the request's section."""

    def __init__(self, inner: Matcher, plan: ThoughtPlan, eos_token_ids: frozenset[int], vocab_size: int) -> None:
        self._inner = inner
        self._vocab_size = vocab_size
        self._start, self._end = plan.markers.start_id, plan.markers.end_id
        self._phase = Phase.THOUGHT if plan.opened else Phase.BEFORE
        self._eos = sorted(eos_token_ids)
        self._history: list[Phase | None] = []  # per advance: the phase it left (None: the inner matcher took it)

    @property
    def answering(self) -> bool:
        """The section is over: the constraint's matcher decides."""
        return self._phase is Phase.ANSWER

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._phase is Phase.ANSWER:
            self._inner.fill_bitmask(bitmask, row)
            return
        bitmask[row].fill_(-1)
        for token in self._eos:  # the thought cannot be the whole output: an answer must follow it
            word, bit = divmod(token, 32)
            if word < bitmask.shape[1]:
                bitmask[row, word] &= _int32(~(1 << bit))

    def forced_tokens(self, limit: int) -> list[int]:
        """What the constraint forces next (constraints/forced.py): nothing in the thought, which is free."""
        return forced_tokens(self._inner, limit, self._vocab_size) if self._phase is Phase.ANSWER else []

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the gate takes from here (the state unchanged): the thought's, the end marker,
        then what the constraint accepts of the rest."""
        if self._phase is Phase.ANSWER:
            return len(accepted_prefix(self._inner, tokens, self._vocab_size))
        taken = 0
        try:
            for token in tokens:
                if token in self._eos or not 0 <= token < self._vocab_size:
                    return taken
                self.advance(token)
                taken += 1
                if self.answering:
                    return taken + len(accepted_prefix(self._inner, tokens[taken:], self._vocab_size))
            return taken
        finally:
            if taken:
                self.rollback(taken)

    def advance(self, token_id: int) -> bool:
        if self._phase is Phase.ANSWER:
            if not self._inner.advance(token_id):
                return False
            self._history.append(None)
            return True
        self._history.append(self._phase)
        if self._phase is Phase.BEFORE:
            self._phase = Phase.THOUGHT if token_id == self._start else Phase.ANSWER
        elif token_id == self._end:
            self._phase = Phase.ANSWER
        return True

    def can_end(self) -> bool:
        return self._phase is Phase.ANSWER and self._inner.can_end()

    def must_end(self) -> bool:
        return self._phase is Phase.ANSWER and self._inner.must_end()

    def rollback(self, tokens: int) -> None:
        inner = 0
        for _ in range(tokens):
            left = self._history.pop()
            if left is None:
                inner += 1
            else:
                if inner:
                    self._inner.rollback(inner)
                    inner = 0
                self._phase = left
        if inner:
            self._inner.rollback(inner)


def _int32(value: int) -> int:
    """``value``'s low 32 bits as a signed int32 (the bitmask's words)."""
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


class ThoughtReader:
    """The answer's reader behind the row's section (``section``: the row's own, advanced before each push)."""

    def __init__(self, inner: OutputReader, fresh: OutputReader, section: ThoughtSection) -> None:
        self._inner = inner
        self._shortest = fresh.endings()  # the answer's shortest outputs (from the empty answer)
        self._fresh_growth = fresh.growth_texts()
        self._section = section

    @property
    def done(self) -> bool:
        return self._section.in_answer and self._inner.done

    @property
    def repeated(self) -> str:
        return self._inner.repeated if self._answering else ""

    @property
    def _answering(self) -> bool:
        """The answer has begun (its first token came after the end marker): the constraint's reader reads."""
        return self._section.in_answer and self._section.answer_tokens > 0

    def growth_texts(self) -> list[str]:
        """In the thought, what one more token can add to the ending: the answer's own growth from its start (a
        thought token adds nothing to the end marker and the shortest answer)."""
        return self._inner.growth_texts() if self._answering else self._fresh_growth

    def push(self, text: str) -> None:
        if self._answering:  # the end marker's own text is the thought's
            self._inner.push(text)

    def endings(self) -> list[str]:
        section = self._section
        if section.in_answer:
            return self._inner.endings() if section.answer_tokens else self._shortest
        markers = section.plan.markers
        head = markers.end_text if section.phase is Phase.THOUGHT else markers.start_text + markers.end_text
        return [head + text for text in self._shortest]


class ThoughtRule:
    """``inner`` (the constraint's output rule) read behind one row's section."""

    def __init__(self, inner: OutputRule, section: ThoughtSection) -> None:
        self._inner = inner
        self._section = section

    def reader(self) -> ThoughtReader:
        return ThoughtReader(self._inner.reader(), self._inner.reader(), self._section)

    def growth_texts(self) -> list[str]:
        return self._inner.growth_texts()
