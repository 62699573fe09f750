"""The engine thread's intra-op thread count: pinned by ``--threads N``, else tuned by measurement.

Why tune: a decode step is hundreds of small parallel regions, each ending at an OpenMP barrier.
When a neighbour process takes CPU time, one of our threads is descheduled and every barrier waits
for it: on the 2-core machine with one busy neighbour, a one-row step took 170-310 ms at two threads
against 55-75 ms at one (36 ms at two on a quiet machine). Nothing tells the process that a
neighbour came or went, so the engine measures: ``ThreadTuner`` is a small hill-climb over
1..budget threads (budget: ``proctor/cpus.py``) on decode steps.

- A *trial* alternates decode steps between a candidate count (one below or one above the
  current) and the current count, ``TRIAL_STEPS`` of each; the candidate wins when its median step
  time is at least ``MARGIN`` below the current one's. A candidate step slower than
  ``EARLY_LOSS`` × the recent step time loses at once (a probe of a bad count costs one step), and
  two candidate steps that much faster win at once.
- Only steps with the same number of rows are compared; when the batch changes size mid-trial the
  trial is dropped and retried soon.
- After a win the next trial comes soon, in the same direction; after a loss the interval doubles
  up to ``MAX_INTERVAL_S``. When the step time at the current count drifts by more than ``DRIFT``
  from the figure settled for that batch size (by the last trial there, else by the first steps),
  the next trial starts at once: towards fewer threads when steps got slower (a neighbour came),
  towards more when they got faster (it left).
- More threads are tried only when a CPU sat idle over the last second (``/proc/stat``), or at
  least every ``FORCE_MORE_S``: under full contention a probe at two threads is the expensive one.

On a quiet machine this costs about one slower step per ``MAX_INTERVAL_S``. Not done, measured:
``OMP_WAIT_POLICY=PASSIVE`` (waiting threads sleep instead of spinning) made two fixed threads
degrade less (1.3× with a neighbour) but cost 15-27 % on a quiet machine at one row (bench/README.md).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from proctor.cpus import IdleCpus, cpu_budget

log = logging.getLogger("proctor.engine.threads")

TRIAL_STEPS = 3  # steps per arm of a trial
MARGIN = 0.05  # the candidate must be this much faster (median step time) to win
EARLY_LOSS = 1.3  # a candidate step this much slower than the recent steps loses the trial at once
DRIFT = 1.3  # step time this far (either way) from the settled figure: probe now
MIN_INTERVAL_S = 1.0
MAX_INTERVAL_S = 16.0
RETRY_S = 0.25  # after a dropped trial (the batch changed size)
RECENT = 5  # steps kept to judge drift and early losses
IDLE_FOR_MORE = 0.5  # idle CPUs needed before trying one more thread
FORCE_MORE_S = 30.0  # try one more thread at least this often, idle CPUs or not


@dataclass
class _Trial:
    candidate: int
    rows: int
    times: dict[int, list[float]] = field(default_factory=dict)

    def arm(self, current: int) -> int:
        """Candidate first, then alternate, so slow drift hits both arms alike."""
        tried = len(self.times.get(self.candidate, []))
        return self.candidate if tried <= len(self.times.get(current, [])) else current


class ThreadPolicy(Protocol):
    threads: int

    def before_step(self, rows: int) -> None: ...

    def after_step(self, elapsed_s: float) -> None: ...


class ThreadTuner:
    """Chooses the thread count for each decode step; call ``before_step`` then ``after_step``.

    Runs on the engine thread (``set_threads`` is ``torch.set_num_threads`` there). ``idle`` returns
    the idle CPUs since its previous call (``proctor/cpus.py``; None: unknown, no gate)."""

    def __init__(self, budget: int, set_threads: Callable[[int], None], *,
                 clock: Callable[[], float] = time.monotonic, tunable: Callable[[], bool] = lambda: True,
                 idle: Callable[[], float | None] = lambda: None) -> None:
        self.budget = max(1, budget)
        self.threads = self.budget  # the count in use outside trials
        self.trials = 0  # trials run (diagnostics and tests)
        self._tunable: Callable[[], bool] | None = tunable  # asked at the first step (inside its fault handling)
        self._frozen = False  # the forward is not thread-invariant: keep the budget, never try others
        self._set, self._clock, self._idle = set_threads, clock, idle
        self._applied = 0
        self._trial: _Trial | None = None
        self._step_threads, self._step_rows = self.threads, 0
        self._interval = MIN_INTERVAL_S
        self._next_trial = clock() + MIN_INTERVAL_S
        self._direction = -1  # of the next trial
        # At the current count, by batch size: the latest step times, and the median a trial saw.
        self._recent: dict[int, deque[float]] = {}
        self._settled: dict[int, float] = {}
        self._idle_at = self._tried_more_at = clock()  # last idle reading, last trial of more threads
        self._apply(self.threads)

    def _apply(self, threads: int) -> None:
        if threads != self._applied:
            self._set(threads)
            self._applied = threads

    def before_step(self, rows: int) -> None:
        """Set the thread count for a decode step over ``rows`` rows."""
        if self._tunable is not None:
            self._frozen = not self._tunable()
            self._tunable = None
        now = self._clock()
        trial = self._trial
        if trial is not None and trial.rows != rows:
            self._trial = trial = None
            self._next_trial = now + RETRY_S
        if trial is None and not self._frozen and self.budget > 1 and now >= self._next_trial:
            self._trial = trial = self._start_trial(rows, now)
        self._step_rows = rows
        self._step_threads = trial.arm(self.threads) if trial is not None else self.threads
        self._apply(self._step_threads)

    def _start_trial(self, rows: int, now: float) -> _Trial | None:
        if self.threads == 1:
            self._direction = 1
        elif self.threads == self.budget:
            self._direction = -1
        candidate = self.threads + self._direction
        if candidate > self.threads and not self._room_for_more(now):
            self._next_trial = now + MIN_INTERVAL_S
            if self.threads > 1:
                self._direction = -1
            return None
        return _Trial(candidate, rows)

    def _room_for_more(self, now: float) -> bool:
        """Whether a CPU sat idle over the last second or so (then one more thread may pay). A stale
        reading (the last one is long past) starts a fresh window and answers no, for now. At least
        every FORCE_MORE_S the answer is yes anyway: a neighbour using part of a CPU leaves too
        little idle time to open the gate, yet one more thread may still be faster."""
        stale, self._idle_at = now - self._idle_at > 2 * MIN_INTERVAL_S, now
        idle = self._idle()
        if now - self._tried_more_at >= FORCE_MORE_S or (not stale and (idle is None or idle >= IDLE_FOR_MORE)):
            self._tried_more_at = now
            return True
        return False

    def after_step(self, elapsed_s: float) -> None:
        """Record the step's duration (decode and pipeline, not prefill)."""
        trial, threads, rows = self._trial, self._step_threads, self._step_rows
        if trial is None or threads == self.threads:
            self._note(rows, elapsed_s)
        if trial is None:
            return
        trial.times.setdefault(threads, []).append(elapsed_s)
        reference = self._reference(rows)
        tried = trial.times.get(trial.candidate, [])
        if threads == trial.candidate and reference is not None and elapsed_s > EARLY_LOSS * reference:
            self._finish(trial, won=False)
        elif threads == trial.candidate and reference is not None and len(tried) >= 2 and \
                max(tried) * EARLY_LOSS < reference:
            self._finish(trial, won=True)  # two clearly faster steps: no need to wait for the third
        elif all(len(trial.times.get(n, [])) >= TRIAL_STEPS for n in (trial.candidate, self.threads)):
            ours = statistics.median(trial.times[self.threads])
            theirs = statistics.median(trial.times[trial.candidate])
            self._finish(trial, won=theirs < ours * (1 - MARGIN))

    def _reference(self, rows: int) -> float | None:
        recent = self._recent.get(rows)
        return statistics.median(recent) if recent else None

    def _note(self, rows: int, elapsed_s: float) -> None:
        """Remember recent steps at the current count; a drift from the settled figure probes now:
        slower steps try fewer threads (a neighbour came), faster ones more (it left)."""
        recent = self._recent.setdefault(rows, deque(maxlen=RECENT))
        recent.append(elapsed_s)
        settled = self._settled.get(rows)
        if self._trial is not None or len(recent) < RECENT:
            return
        if settled is None:  # the first full window at this count and size is the figure to drift from
            self._settled[rows] = statistics.median(recent)
            return
        median = statistics.median(recent)
        direction = -1 if median > DRIFT * settled else 1 if median * DRIFT < settled else 0
        if direction and 1 <= self.threads + direction <= self.budget:
            self._settled.clear()
            self._direction = direction
            self._interval = MIN_INTERVAL_S
            self._next_trial = self._clock()

    def _finish(self, trial: _Trial, *, won: bool) -> None:
        self._trial = None
        self.trials += 1
        now = self._clock()
        log.debug("trial at %d rows: %d threads %s ms, %d threads %s ms: %s", trial.rows, trial.candidate,
                  _ms(trial.times.get(trial.candidate)), self.threads, _ms(trial.times.get(self.threads)),
                  "switch" if won else "keep")
        if won:
            self.threads = trial.candidate
            self._recent.clear()
            self._settled.clear()
            self._interval = MIN_INTERVAL_S
            onward = 1 <= self.threads + self._direction <= self.budget
            self._next_trial = now if onward else now + MIN_INTERVAL_S  # keep climbing while it pays
            self._idle()  # the next idle reading covers the time at the new count only
            self._idle_at = now
        else:
            self._direction = -self._direction
            self._interval = min(2 * self._interval, MAX_INTERVAL_S)
            self._next_trial = now + self._interval
        kept = trial.times.get(self.threads)
        settled = statistics.median(kept) if kept else self._reference(trial.rows)
        if settled is not None:
            self._settled[trial.rows] = settled
        self._apply(self.threads)


def _ms(times: list[float] | None) -> str:
    return "/".join(f"{t * 1000:.0f}" for t in times or [])


class PinnedThreads:
    """``--threads N``: exactly N threads, set once on the engine thread, never changed."""

    def __init__(self, threads: int, set_threads: Callable[[int], None]) -> None:
        self.threads = threads
        set_threads(threads)

    def before_step(self, rows: int) -> None:
        pass

    def after_step(self, elapsed_s: float) -> None:
        pass


def thread_policy(threads: int, set_threads: Callable[[int], None], tunable: Callable[[], bool]) -> ThreadPolicy:
    """``threads`` > 0: exactly that many. 0: the CPU budget (``proctor/cpus.py``), tuned by measurement
    when ``tunable()`` says the forward gives the same bits at any thread count (the slot forward
    with oneDNN-packed weights does; transformers' own forward and MKL do not, so tuning there would
    make a row's logits depend on the machine's load and break audited replay)."""
    if threads > 0:
        return PinnedThreads(threads, set_threads)
    return ThreadTuner(cpu_budget(), set_threads, tunable=tunable, idle=IdleCpus())
