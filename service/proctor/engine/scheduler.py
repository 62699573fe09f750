"""Admission and the step plan: a bounded waiting queue in front of the running batch, and what every row is fed.

At every step boundary ``plan`` decides the whole step as data (a ``StepPlan``, like vLLM v1's ``SchedulerOutput``)
and changes nothing: not the batch, not the queue, not a request's status. The engine applies it
(Engine._apply): the requests ``leaving`` end (cancelled, past the deadline) and free their rows, the ``join``ers
leave the queue and take rows, then the ``feeds`` run in the step's one forward, within a limit of
``max_step_tokens`` tokens (vLLM's ``num_scheduled_tokens``):

1. every running row its last token — always, so a long prompt never starves the rows that decode;
2. each running row's draft (forced by its constraint, or looked up: engine/drafting.py), where the executor
   verifies drafts, within half the step's tokens (``DRAFT_SHARE``), so prompts keep the rest;
3. the prompts still being fed, oldest first, then waiting requests that join (a free row, room in the KV cache),
   each given as much of its prompt as the step has room for after what the prefix cache holds of it (the
   whole prompt in one step where the executor cannot split one: executor/protocol.Capabilities).

Running rows before waiting ones, as vLLM's scheduler orders them. The plan is made as if the leaving requests
were already gone: their rows and cache are free for the joiners.

Beam-search requests wait in the same queue and join in order, with a row a beam (engine/beam.py): their prompt
is fed like any other, then every beam its last token each step, right after the running rows' feeds.
Beyond ``max_waiting`` waiting requests a new one is refused at once (``Overloaded`` → RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from proctor.domain import FinishReason, Overloaded
from proctor.engine.batch import DecodeBatch, PrefixHit, RowFeed
from proctor.engine.sequence import SequenceState
from proctor.engine.status import RequestStatus
from proctor.executor.protocol import Capabilities

Drafts = Callable[[list[SequenceState]], list[list[int]]]  # the running rows' proposed drafts (engine/drafting.py)
Leaving = tuple[SequenceState, FinishReason]
DRAFT_SHARE = 0.5  # of the step's tokens, at most, for drafts


@dataclass(frozen=True, slots=True)
class Join:
    """A waiting request that takes a row this step (a beam request: a row a beam), and what the prefix cache holds
    of its prompt (its first feed starts after that)."""

    state: SequenceState
    prefix: PrefixHit


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one engine step does, decided before any of it runs (Engine._apply carries it out).

    ``leaving``: requests that end now without a token (cancelled, past the deadline), wherever they are; ``join``:
    waiting requests that take a row, oldest first (their first prompt piece is among the feeds); ``feeds``: what
    each row is fed in the step's one forward: the running rows (last token and draft), then the beams, then
    prompt pieces."""

    leaving: tuple[Leaving, ...] = ()
    join: tuple[Join, ...] = ()
    feeds: tuple[RowFeed, ...] = ()

    @property
    def tokens(self) -> int:
        return sum(len(feed.tokens) for feed in self.feeds)

    @property
    def drafted(self) -> int:
        """Draft tokens fed (each decoding row's tokens after its last one)."""
        return sum(len(feed.tokens) - 1 for feed in self.feeds if not feed.prompt and feed.beam is None)


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

    def take(self, states: list[SequenceState]) -> None:
        """Take ``states`` out of the waiting queue (the engine applying a plan: they leave, or join the batch)."""
        if not states:
            return
        with self._lock:
            for state in states:
                self._waiting.remove(state)

    def drain(self) -> list[SequenceState]:
        with self._lock:
            taken = list(self._waiting)
            self._waiting.clear()
            return taken

    def plan(self, batch: DecodeBatch, *, now: float, admit: bool, drafts: Drafts) -> StepPlan:
        """This step's plan, as data; nothing changes here (``admit`` False while shutting down: nobody joins)."""
        with self._lock:
            waiting = list(self._waiting)
        leaving = _expired([*batch.states, *(search.host for search in batch.searches), *waiting], now)
        gone = frozenset(id(state) for state, _ in leaving)
        staying = [state for state in batch.states if id(state) not in gone]
        searches = [search for search in batch.searches if id(search.host) not in gone]
        waiting = [state for state in waiting if id(state) not in gone]
        capabilities = batch.capabilities if staying or searches or waiting else None
        decoding = [state for state in staying if state.status is RequestStatus.RUNNING]
        drafted = drafts(decoding) if decoding and capabilities is not None and capabilities.extend else []
        feeds: list[RowFeed] = []
        room = int(self.max_step_tokens * DRAFT_SHARE)
        for index, state in enumerate(decoding):
            draft = drafted[index][:max(0, room)] if drafted else []
            room -= len(draft)
            feeds.append(RowFeed(state, [state.generated[-1], *draft], prompt=False))
        for search in searches:
            if search.host.status is RequestStatus.RUNNING:
                feeds += [RowFeed(search.host, [token], prompt=False, beam=beam)
                          for beam, token in enumerate(search.lane_tokens())]
        room = self.max_step_tokens - sum(len(feed.tokens) for feed in feeds)
        first = True  # no prompt fed yet this step
        staged = [(state, None) for state in staying] + [(search.host, 0) for search in searches]
        for state, beam in staged:
            if state.status is RequestStatus.PREFILLING:
                assert capabilities is not None
                piece = _piece(state, room, capabilities, first=first)
                if piece:
                    feeds.append(RowFeed.piece(state, piece, beam))
                    room, first = room - len(piece), False
        joins: list[Join] = []
        if admit and capabilities is not None:
            for state in _joining(batch, waiting, gone, room, capabilities, first=first):
                join = Join(state, batch.prefix_hit(state))
                piece = _piece(state, room, capabilities, first=first, fed=join.prefix.tokens)
                beam = 0 if state.request.sampling.num_beams > 1 else None  # a beam search's prompt: its first slot
                feeds.append(RowFeed.piece(state, piece, beam, fed=join.prefix.tokens))
                joins.append(join)
                room, first = room - len(piece), False
        return StepPlan(tuple(leaving), tuple(joins), tuple(feeds))


def _expired(states: list[SequenceState], now: float) -> list[Leaving]:
    """The requests that end now without a token (cancelled, or past their deadline), in ``states``' order."""
    leaving = []
    for state in states:
        reason = state.check_external(now)
        if reason is not None:
            leaving.append((state, reason))
    return leaving


def _joining(batch: DecodeBatch, waiting: list[SequenceState], gone: frozenset[int], room: int,
             capabilities: Capabilities, first: bool) -> list[SequenceState]:
    """The waiting requests that join ``batch`` at this step boundary, oldest first: while rows are free (a beam
    request takes one a beam), the cache has room once the ``gone`` requests left, and the step has tokens
    left for a prompt."""
    group: list[SequenceState] = []
    for candidate in waiting:
        piece = _piece(candidate, room, capabilities, first=first and not group, fed=0)
        if not piece or not batch.fits([*group, candidate], gone):
            break
        group.append(candidate)
        room -= len(piece)
    return group


def _piece(state: SequenceState, room: int, capabilities: Capabilities, *, first: bool,
           fed: int | None = None) -> list[int]:
    """The next piece of ``state``'s prompt within ``room`` tokens (``fed``: its tokens already in the cache;
    None: its ``prompt_fed``). An executor that cannot split a prompt gets it whole: within the room, or as the
    step's first prompt whatever its length (a prompt longer than the step's limit must run some time)."""
    start = state.prompt_fed if fed is None else fed
    rest = state.prompt_ids[start:]
    if capabilities.split_prompts:
        return rest[:max(0, room)]
    return rest if first or len(rest) <= room else []
