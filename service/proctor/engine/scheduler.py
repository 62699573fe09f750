"""Admission and the step plan: a bounded waiting queue in front of the running batch (continuous batching).

At every step boundary ``plan`` says who leaves (cancelled, past the deadline) and who starts: the oldest
waiting requests join the running batch while there is a free slot and the KV-cache budget allows, up to
``max_prefill_tokens`` of prompt per step (always at least one request), so a burst of long prompts cannot
stall the running rows for long. Beam-search requests wait in the same queue and start in order (they take
no row of the batch: engine/beam.py). Beyond ``max_waiting`` waiting requests a new one is refused at once
(``Overloaded`` → RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from proctor.domain import FinishReason, Overloaded
from proctor.engine.batch import DecodeBatch
from proctor.engine.sequence import SequenceState


@dataclass(slots=True)
class StepPlan:
    """What one engine step does, decided before any of it runs (Engine._step carries it out, in this order).

    ``leaving``: requests that end now, without a token (cancelled, or past their deadline), wherever they
    are; ``join``: waiting requests whose prompts are prefilled whole into free rows this step (they get their
    first token from that prefill); ``stage``: waiting requests whose long prompts start a chunked prefill;
    ``beams``: waiting beam-search requests whose searches start (on their own runner, engine/beam.py);
    then the oldest staged prompt gets one chunk, the running rows decode, and the beam searches step.
    Finished rows leave after each phase. How far each running row extends is decided last, once the joiners
    have their first token (engine/drafting.py: a forced run or a looked-up draft, verified in the same
    forward as the single-token rows; engine/verify.py)."""

    leaving: list[tuple[SequenceState, FinishReason]] = field(default_factory=list)
    join: list[SequenceState] = field(default_factory=list)
    stage: list[SequenceState] = field(default_factory=list)
    beams: list[SequenceState] = field(default_factory=list)


class Scheduler:
    def __init__(self, max_waiting: int, max_prefill_tokens: int, free_rows: Callable[[], int] = lambda: 0) -> None:
        self.max_waiting = max_waiting
        # Rows of the running batch that are free now (read without the engine's lock: a hint). Requests
        # that will take them at the next step are not counted against max_waiting.
        self._free_rows = free_rows
        self.max_prefill_tokens = max_prefill_tokens
        self._waiting: deque[SequenceState] = deque()
        self._reserved = 0  # calls admitted and still being prepared (tokenized, compiled) before they enqueue
        self._lock = threading.Lock()

    def reserve(self) -> None:
        """Hold a place for a call about to be prepared, or refuse it at once (Overloaded) when the waiting
        requests and the calls being prepared already fill the queue: a burst is then refused in
        microseconds, not after each excess call was tokenized. ``enqueue`` stays the authority."""
        with self._lock:
            if len(self._waiting) + self._reserved >= self._capacity():
                raise Overloaded(f"the waiting queue is full ({self.max_waiting} requests); retry later")
            self._reserved += 1

    def unreserve(self) -> None:
        with self._lock:
            self._reserved -= 1

    def _capacity(self) -> int:
        return self.max_waiting + max(0, self._free_rows())

    def enqueue(self, state: SequenceState) -> None:
        with self._lock:
            if len(self._waiting) >= self._capacity():
                raise Overloaded(f"the waiting queue is full ({self.max_waiting} requests); retry later")
            self._waiting.append(state)

    def waiting_count(self) -> int:
        with self._lock:
            return len(self._waiting)

    def reserved_count(self) -> int:
        """Calls admitted and still being prepared (``reserve``d, not yet ``unreserve``d)."""
        with self._lock:
            return self._reserved

    def plan(self, batch: DecodeBatch, now: float, *, admit: bool) -> StepPlan:
        """This step's plan (``admit`` False while shutting down: nobody joins)."""
        plan = StepPlan()
        for state in [*batch.states, *batch.staged]:
            reason = state.check_external(now)
            if reason is not None:
                plan.leaving.append((state, reason))
        for state in self.remove_where(lambda s: s.check_external(now) is not None):
            reason = state.check_external(now)
            assert reason is not None
            plan.leaving.append((state, reason))
        if not admit:
            return plan
        joining, plan.beams = self.take_joining(batch, {id(state) for state, _ in plan.leaving})
        for state in joining:
            (plan.stage if batch.needs_chunks(state) else plan.join).append(state)
        return plan

    def take_joining(self, batch: DecodeBatch, leaving: set[int] | None = None
                     ) -> tuple[list[SequenceState], list[SequenceState]]:
        """The waiting requests that start at this step boundary, oldest first: those that join ``batch``, and
        the beam searches (which take no row of it). ``leaving``: ids (``id()``) of the batch's requests that
        end this step, whose rows and cache do not count."""
        with self._lock:
            group: list[SequenceState] = []
            beams: list[SequenceState] = []
            prompt_tokens = 0
            while self._waiting:
                candidate = self._waiting[0]
                if candidate.request.sampling.num_beams > 1:
                    beams.append(self._waiting.popleft())
                    continue
                if group and prompt_tokens + len(candidate.prompt_ids) > self.max_prefill_tokens:
                    break
                if not batch.fits([*group, candidate], leaving):
                    break
                group.append(self._waiting.popleft())
                prompt_tokens += len(candidate.prompt_ids)
            return group, beams

    def remove_where(self, predicate: Callable[[SequenceState], bool]) -> list[SequenceState]:
        """Take out waiting sequences matching ``predicate`` (cancelled or past their deadline)."""
        with self._lock:
            taken = [s for s in self._waiting if predicate(s)]
            for s in taken:
                self._waiting.remove(s)
            return taken

    def drain(self) -> list[SequenceState]:
        with self._lock:
            taken = list(self._waiting)
            self._waiting.clear()
            return taken
