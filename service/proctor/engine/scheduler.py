"""Admission and the step plan: a bounded waiting queue in front of the running batch, and what every row is fed.

At every step boundary ``expired`` says who leaves (cancelled, past the deadline); once they are gone, ``plan``
says who starts and what each row is fed in the step's one forward, within a budget of ``max_step_tokens``
tokens (vLLM's ``num_scheduled_tokens``):

1. every running row its last token — always, so a long prompt never starves the rows that decode;
2. each running row's draft (forced by its constraint, or looked up: engine/drafting.py), where the executor
   verifies drafts, within half the budget (``DRAFT_SHARE``), so prompts keep the rest;
3. the prompts still being fed, oldest first, then waiting requests that join (a free row, room in the KV-cache
   budget), each given as much of its prompt as the budget has left (the whole prompt in one step where the
   executor cannot split one: executor/protocol.Capabilities).

Running rows before waiting ones, as vLLM's scheduler orders them.

Beam-search requests wait in the same queue and join in order, with a row a beam (engine/beam.py): their prompt
is fed like any other, then every beam its last token each step, right after the running rows' feeds.
Beyond ``max_waiting`` waiting requests a new one is refused at once (``Overloaded`` → RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from proctor.domain import FinishReason, Overloaded
from proctor.engine.batch import BeamRows, DecodeBatch, RowFeed
from proctor.engine.sequence import SequenceState
from proctor.engine.status import RequestStatus
from proctor.executor.protocol import Capabilities

Drafts = Callable[[list[SequenceState]], list[list[int]]]
Searches = Callable[[SequenceState], BeamRows]  # a joining beam request's search (engine/beam.BeamSearches.take)
DRAFT_SHARE = 0.5  # of the step's budget, at most, for drafts


@dataclass(slots=True)
class StepPlan:
    """What one engine step does, decided before any of it runs (Engine._step carries it out).

    ``join``: waiting requests that take a row (a beam request: a row a beam) this step (their first prompt piece
    is among the feeds); ``feeds``: what each row is fed in the step's one forward: the running rows (and
    drafts), then the beams, then prompt pieces."""

    join: list[SequenceState] = field(default_factory=list)
    feeds: list[RowFeed] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(feed.tokens) for feed in self.feeds)


class Scheduler:
    def __init__(self, max_waiting: int, max_step_tokens: int, free_rows: Callable[[], int] = lambda: 0) -> None:
        self.max_waiting = max_waiting
        # Rows of the running batch that are free now (read without the engine's lock: a hint). Requests
        # that will take them at the next step are not counted against max_waiting.
        self._free_rows = free_rows
        self.max_step_tokens = max_step_tokens
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

    def expired(self, batch: DecodeBatch, now: float) -> list[tuple[SequenceState, FinishReason]]:
        """The requests that end now without a token (cancelled, or past their deadline), wherever they are; the
        waiting ones leave the queue. The engine ends them before it asks for the ``plan``."""
        leaving = []
        for state in [*batch.states, *(search.host for search in batch.searches)]:
            reason = state.check_external(now)
            if reason is not None:
                leaving.append((state, reason))
        for state in self.remove_where(lambda s: s.check_external(now) is not None):
            reason = state.check_external(now)
            assert reason is not None
            leaving.append((state, reason))
        return leaving

    def plan(self, batch: DecodeBatch, *, admit: bool, drafts: Drafts, searches: Searches) -> StepPlan:
        """This step's plan, once the expired requests are gone (``admit`` False while shutting down: nobody
        joins; ``searches``: a joining beam request's search)."""
        plan = StepPlan()
        staying = list(batch.states)
        decoding = [state for state in staying if state.status is RequestStatus.RUNNING]
        capabilities = batch.capabilities if staying or batch.searches or self.waiting_count() else None
        drafted = drafts(decoding) if decoding and capabilities is not None and capabilities.extend else []
        room = int(self.max_step_tokens * DRAFT_SHARE)
        for index, state in enumerate(decoding):
            draft = drafted[index][:max(0, room)] if drafted else []
            room -= len(draft)
            plan.feeds.append(RowFeed(state, [state.generated[-1], *draft], prompt=False))
        for search in batch.searches:
            if search.host.status is RequestStatus.RUNNING:
                plan.feeds += [RowFeed(search.host, [token], prompt=False, beam=beam)
                               for beam, token in enumerate(search.lane_tokens())]
        budget = self.max_step_tokens - plan.tokens
        first = True  # no prompt fed yet this step
        staged = [(state, None) for state in staying] + [(search.host, 0) for search in batch.searches]
        for state, beam in staged:
            if state.status is RequestStatus.PREFILLING:
                assert capabilities is not None
                piece = _piece(state, budget, capabilities, first=first)
                if piece:
                    plan.feeds.append(RowFeed.piece(state, piece, beam))
                    budget, first = budget - len(piece), False
        if admit and capabilities is not None:
            plan.join = self.take_joining(batch, budget, capabilities, first=first)
            for state in plan.join:
                beam = None
                if state.request.sampling.num_beams > 1:
                    batch.join_search(searches(state))  # a slot a beam; the prompt into the first
                    beam = 0
                else:
                    batch.join(state)  # its row, and what the prefix cache holds of its prompt
                piece = _piece(state, budget, capabilities, first=first)
                plan.feeds.append(RowFeed.piece(state, piece, beam))
                budget, first = budget - len(piece), False
        return plan

    def take_joining(self, batch: DecodeBatch, budget: int, capabilities: Capabilities,
                     first: bool) -> list[SequenceState]:
        """The waiting requests that join ``batch`` at this step boundary, oldest first: while rows are free (a
        beam request takes one a beam), the cache has room, and the step's budget has tokens left for a prompt."""
        with self._lock:
            group: list[SequenceState] = []
            while self._waiting:
                candidate = self._waiting[0]
                piece = _piece(candidate, budget, capabilities, first=first and not group, fed=0)
                if not piece or not batch.fits([*group, candidate]):
                    break
                group.append(self._waiting.popleft())
                budget -= len(piece)
            return group

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


def _piece(state: SequenceState, budget: int, capabilities: Capabilities, *, first: bool,
           fed: int | None = None) -> list[int]:
    """The next piece of ``state``'s prompt within ``budget`` tokens (``fed``: its tokens already in the cache;
    None: its ``prompt_fed``). An executor that cannot split a prompt gets it whole: within the budget, or as the
    step's first prompt whatever its length (a prompt longer than the budget must run some time)."""
    start = state.prompt_fed if fed is None else fed
    rest = state.prompt_ids[start:]
    if capabilities.split_prompts:
        return rest[:max(0, budget)]
    return rest if first or len(rest) <= budget else []
