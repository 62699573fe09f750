"""One request's thought: where it stands in the prompt, and where it stands as the output is written (issue 56).

``plan_thought`` reads the rendered prompt once, before the request runs: a prompt that ends with the start marker
opened the section (DeepSeek-R1's template; Qwen3's with thinking on when the template writes it); one that ends
with the end marker closed it (Qwen3's template with ``enable_thinking`` false writes an empty thought): no section;
otherwise a request that thinks (``reasoning.enabled`` true or unset) has the start marker forced as its first
token, so the section is always the model's first output and the constraint's start is known.

``ThoughtSection`` follows one row's tokens: before the section (its start is forced next), in the thought, or in
the answer. It says what to force (the end marker at the thought budget, ``reasoning.max_tokens``) and how many
tokens the section took (``usage.reasoning_tokens``, the markers included). Markers are token ids
(engine/thought_markers.py), so the reading is exact and a replay reads the same.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proctor.domain.reasoning import ReasoningParams
from proctor.engine.thought_markers import ThoughtMarkers


class Phase(enum.Enum):
    BEFORE = "before"  # the start marker is forced next
    THOUGHT = "thought"
    ANSWER = "answer"


@dataclass(frozen=True, slots=True)
class ThoughtPlan:
    """A request's section: ``opened`` the prompt left it open; ``force_open`` the start marker is the first token;
    ``close_at_once`` the end marker is (a section the template opened on a request that does not think)."""

    markers: ThoughtMarkers
    opened: bool
    force_open: bool = False
    close_at_once: bool = False
    max_tokens: int | None = None
    exclude: bool = False

    @property
    def first_tokens(self) -> tuple[int, ...]:
        """The tokens forced from the first position on."""
        if self.force_open:
            return (self.markers.start_id,)
        return (self.markers.end_id,) if self.close_at_once else ()

    @property
    def overhead(self) -> int:
        """The section's least cost in tokens: its markers still to come (the answer's budget reserves them)."""
        return 2 if self.force_open else 1


def plan_thought(markers: ThoughtMarkers | None, rendered_prompt: str, reasoning: ReasoningParams,
                 chat: bool) -> ThoughtPlan | None:
    """The request's section, or None when it has none (no parser, a plain prompt that did not open one, thinking
    closed by the template, or turned off)."""
    if markers is None:
        return None
    tail = rendered_prompt.rstrip()
    opened = tail.endswith(markers.start_text)
    if not opened and (tail.endswith(markers.end_text) or not chat):
        return None
    thinks = reasoning.enabled is not False and reasoning.max_tokens != 0
    if opened:
        return ThoughtPlan(markers, True, close_at_once=not thinks, max_tokens=reasoning.max_tokens,
                           exclude=reasoning.exclude)
    if not thinks:
        return None
    return ThoughtPlan(markers, False, force_open=True, max_tokens=reasoning.max_tokens, exclude=reasoning.exclude)


class ThoughtSection:
    """Where one row's output stands against its section (advanced once per committed token)."""

    def __init__(self, plan: ThoughtPlan) -> None:
        self.plan = plan
        self.phase = Phase.THOUGHT if plan.opened else Phase.BEFORE
        self.tokens = 0  # the section's tokens so far, markers included
        self.thought_tokens = 0  # the thought's own (markers not counted): what max_tokens bounds
        self.answer_tokens = 0

    @property
    def in_answer(self) -> bool:
        return self.phase is Phase.ANSWER

    def advance(self, token_id: int) -> bool:
        """Follow a committed token; whether it belongs to the section (its text is the thought's, not the
        answer's)."""
        markers = self.plan.markers
        if self.phase is Phase.ANSWER:
            self.answer_tokens += 1
            return False
        self.tokens += 1
        if self.phase is Phase.BEFORE:
            self.phase = Phase.THOUGHT if token_id == markers.start_id else Phase.ANSWER
        elif token_id == markers.end_id:
            self.phase = Phase.ANSWER
        else:
            self.thought_tokens += 1
        return True

    def due(self) -> tuple[int, ...]:
        """The end marker, when the thought reached its budget (forced from the next position on), else ()."""
        most = self.plan.max_tokens
        if self.phase is Phase.THOUGHT and most is not None and self.thought_tokens >= most:
            return (self.plan.markers.end_id,)
        return ()
