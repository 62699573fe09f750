"""One engine step, on the engine thread: schedule → apply → execute → update.

The scheduler decides the step as data and changes nothing (engine/scheduler.py's ``StepPlan``); everything the
step changes happens here, in one order:

1. **apply** the plan: the requests ``leaving`` end without a token and free their rows; the joiners leave the
   waiting queue and take their rows, with what the prefix cache held of their prompts (engine/batch.py);
2. **execute**: one forward over the plan's feeds (``DecodeBatch.forward``);
3. **update**: the decoding rows get their tokens (drafts verified position by position: engine/verify.py), the
   beam searches their selection (engine/beam.py), the rows whose prompt completed their first token; then the
   finished rows leave.

Only this module and the scheduler's ``take`` change who is where; a request's status changes here and in its own
state (engine/status.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from proctor.decoding.masks import constraints_ahead
from proctor.decoding.pipeline import run_pipeline
from proctor.domain import FinishReason
from proctor.engine.batch import DecodeBatch, RowFeed, logit_rows
from proctor.engine.beam import BeamSearches, update_searches
from proctor.engine.drafting import Drafter
from proctor.engine.live import LiveRequests
from proctor.engine.scheduler import Leaving, Scheduler, StepPlan
from proctor.engine.status import RequestStatus
from proctor.engine.thread_tuner import ThreadPolicy
from proctor.engine.verify import verify

if TYPE_CHECKING:
    from proctor.observability.hooks import StepObserver


class StepRunner:
    """The engine's step over its scheduler, batch, drafter, beam searches and registry of live requests."""

    def __init__(self, vocab_size: int, scheduler: Scheduler, batch: DecodeBatch, drafter: Drafter,
                 beams: BeamSearches, live: LiveRequests) -> None:
        self._vocab = vocab_size
        self._scheduler = scheduler
        self._batch = batch
        self._drafter = drafter
        self._beams = beams
        self._live = live

    def step(self, *, admit: bool, threads: ThreadPolicy, observer: StepObserver | None) -> bool:
        """One step; False when there was nothing to feed (``admit`` False while shutting down: nobody joins)."""
        now = time.monotonic()
        plan = self._scheduler.plan(self._batch, now=now, admit=admit, drafts=self._drafter.drafts)
        self.apply(plan, now)
        if not plan.feeds:
            return False
        decoding = sum(not feed.prompt for feed in plan.feeds)
        threads.before_step(len(plan.feeds))
        start = time.monotonic()
        feeds = list(plan.feeds)
        logits = self._batch.forward(feeds)  # on CUDA this returns once launched: the update fills masks first
        self._update(feeds, logits, observer)
        elapsed = time.monotonic() - start
        threads.after_step(elapsed)
        _observe(observer, elapsed, decoding, plan)
        return True

    def apply(self, plan: StepPlan, now: float) -> None:
        """Carry out the plan's changes before its forward: the leaving requests end and free their rows, the
        joiners leave the queue and take theirs (with what the prefix cache held of their prompts)."""
        self._scheduler.take([state for state, _ in plan.leaving if state.status is RequestStatus.WAITING]
                             + [join.state for join in plan.join])
        self.end(list(plan.leaving), now)
        for join in plan.join:
            state = join.state
            if state.request.sampling.num_beams > 1:  # a slot a beam; the prompt into the first
                self._batch.join_search(self._beams.take(state), join.prefix)
            else:
                self._batch.join(state, join.prefix)
            state.started = now
            state.status = RequestStatus.PREFILLING

    def _update(self, feeds: list[RowFeed], logits: torch.Tensor, observer: StepObserver | None) -> None:
        """The update pass: the decoding rows get their token (and their drafts, verified position by position:
        engine/verify.py), the beam searches their selection (engine/beam.py), the rows whose prompt completed
        their first token; then the finished rows leave. ``logits`` hold each feed's wanted positions in the
        plan's order: the decoding rows first."""
        masks = observer.masks if observer is not None else None
        decoding = [feed for feed in feeds if not feed.prompt and feed.beam is None]
        drafted = sum(len(feed.tokens) for feed in decoding)
        after = logit_rows(feeds[len(decoding):], drafted)
        completed = [(feed.state, rows[-1]) for feed, rows in after if feed.beam is None and feed.completes]
        states = [feed.state for feed in decoding]
        # The constraint bitmasks of the rows sampled first, filled before any logit is read: on CUDA the forward
        # (launched, not waited for) still runs on the device meanwhile.
        ahead = (constraints_ahead([state.row for state in states], self._vocab),
                 constraints_ahead([state.row for state, _ in completed], self._vocab))
        if decoding:
            drafts = [feed.tokens[1:] for feed in decoding]
            kept = verify(states, drafts, logits[:drafted], time.monotonic, masks, ahead[0])
            self._batch.settle(kept)
            if drafted > len(decoding):
                self._drafter.learn(states, drafts, kept)
        update_searches(self._batch, after, logits)
        if completed:
            for state, _ in completed:
                state.status = RequestStatus.RUNNING
            decisions = run_pipeline(logits[[row for _, row in completed]], [state.row for state, _ in completed],
                                     masks, ahead[1])
            now = time.monotonic()
            for (state, _), decision in zip(completed, decisions, strict=True):
                state.commit(decision, now)
        self.retire()

    def end(self, leaving: list[Leaving], now: float) -> None:
        """End the leaving requests without a token, wherever they are, and free their rows."""
        for state, reason in leaving:
            state.finish_without_token(reason, now)
            self._beams.drop(state)
            self._live.forget_state(state)
        self.retire()

    def retire(self) -> None:
        """The finished rows and answered searches leave the batch."""
        batch = self._batch
        for search in [search for search in batch.searches if search.host.finished]:
            batch.release_search(search)
            self._live.forget_state(search.host)
        done = [i for i, s in enumerate(batch.states) if s.finished]
        if not done:
            return
        states = [batch.states[i] for i in done]
        batch.remove(done)
        for state in states:
            self._live.forget_state(state)

    def fail_running(self, message: str) -> None:
        """An engine fault: every request in the batch ends with an error and the batch is cleared."""
        now = time.monotonic()
        for state in [*self._batch.states, *(search.host for search in self._batch.searches)]:
            if not state.finished:
                state.finish_without_token(FinishReason.ERROR, now, detail=message, error=message)
            self._live.forget_state(state)
        self._batch.clear()

    def fail_waiting(self, reason: FinishReason, message: str, error: str | None = None) -> None:
        """End every waiting request (the server shut down before it ran, or the engine cannot step)."""
        now = time.monotonic()
        for state in self._scheduler.drain():
            state.finish_without_token(reason, now, detail=message, error=error)
            self._beams.drop(state)
            self._live.forget_state(state)


def _observe(observer: StepObserver | None, elapsed: float, decoding: int, plan: StepPlan) -> None:
    """The step's time for the metrics: as a prefill when it fed any prompt (one forward carries both), else as a
    decode step over its ``decoding`` rows."""
    if observer is None:
        return
    if any(feed.prompt for feed in plan.feeds):
        observer.prefill(elapsed, sum(feed.completes for feed in plan.feeds))
    else:
        observer.decode_step(elapsed, decoding)

