"""The engine's thread policy, driven by a simulated machine: step time as a function of the thread
count and of whether a neighbour is taking CPU time (figures shaped like bench/README.md's)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from proctor.engine import thread_tuner
from proctor.engine.thread_tuner import FORCE_MORE_S, MAX_INTERVAL_S, PinnedThreads, ThreadTuner, thread_policy

# Seconds per decode step on two cores: quiet, one thread is slower; with a busy neighbour, two
# threads wait at every barrier for the descheduled one.
QUIET = {1: 0.056, 2: 0.036}
BUSY = {1: 0.060, 2: 0.200}


class Machine:
    def __init__(self, budget: int, cost: Callable[[float, int], float], tunable: bool = True,
                 idle: Callable[[], float | None] = lambda: None) -> None:
        self.now = 0.0
        self.applied: list[int] = []
        self.cost = cost
        self.tuner = ThreadTuner(budget, self.applied.append, clock=lambda: self.now, tunable=lambda: tunable,
                                 idle=idle)
        self.used: Counter[int] = Counter()

    @property
    def current(self) -> int:
        return self.applied[-1]

    def run(self, seconds: float, rows: Callable[[int], int] = lambda _: 1) -> None:
        end, step = self.now + seconds, 0
        while self.now < end:
            self.tuner.before_step(rows(step))
            elapsed = self.cost(self.now, self.current)
            self.used[self.current] += 1
            self.now += elapsed
            self.tuner.after_step(elapsed)
            step += 1


def two_cores(neighbour: Callable[[float], bool]) -> Callable[[float, int], float]:
    return lambda now, n: (BUSY if neighbour(now) else QUIET)[n]


def test_quiet_machine_keeps_all_threads_and_seldom_probes() -> None:
    machine = Machine(2, two_cores(lambda _: False))
    machine.run(120)
    assert machine.tuner.threads == 2
    # Probing costs steps at one thread; after the first few trials, about one step per MAX_INTERVAL_S.
    assert machine.used[1] <= 120 / MAX_INTERVAL_S + 6, machine.used
    assert machine.used[1] / sum(machine.used.values()) < 0.01


def test_a_neighbour_moves_it_to_one_thread_and_its_departure_back() -> None:
    machine = Machine(2, two_cores(lambda now: 20 <= now < 60))
    machine.run(20)
    assert machine.tuner.threads == 2
    machine.run(3)  # the neighbour arrived at 20 s: the drift in step time triggers a trial at once
    assert machine.tuner.threads == 1
    before = Counter(machine.used)
    machine.run(37)
    assert machine.tuner.threads == 1
    probes = machine.used[2] - before[2]
    assert probes <= 40 / MAX_INTERVAL_S + 6, "probing two threads under load costs about one step each time"
    machine.run(MAX_INTERVAL_S + 2)  # gone at 60 s: the next upward probe wins
    assert machine.tuner.threads == 2


def test_with_a_neighbour_from_the_start_it_settles_within_seconds() -> None:
    machine = Machine(2, two_cores(lambda _: True))
    machine.run(2.5)
    assert machine.tuner.threads == 1


def test_a_wider_budget_climbs_down_to_the_best_count() -> None:
    # 8 CPUs, 3 of them taken by neighbours: 5 threads is fastest; each thread beyond costs a lot.
    def cost(now: float, n: int) -> float:
        return 0.2 / n + (0.05 * (n - 5) if n > 5 else 0.0)

    machine = Machine(8, cost)
    machine.run(30)
    assert machine.tuner.threads == 5
    assert machine.current == 5


def test_trials_only_compare_steps_of_the_same_batch_size() -> None:
    """With the batch changing size every step no trial completes, so nothing moves, though one
    thread looks faster whenever it happens to run the smaller batch."""
    machine = Machine(2, lambda now, n: 0.03 if n == 1 else 0.05)  # n=1 steps: odd (small) batches
    machine.run(60, rows=lambda step: 1 + step % 2)
    assert machine.tuner.trials == 0
    assert machine.tuner.threads == 2


def test_noise_does_not_flip_it_back_and_forth() -> None:
    """On a quiet machine, isolated slow steps (another process waking briefly) never make one thread win."""
    def cost(now: float, n: int) -> float:
        jitter = 3.0 if int(now * 1000) % 97 == 0 else 1.0
        return QUIET[n] * jitter

    machine = Machine(2, cost)
    machine.run(120)
    assert machine.tuner.threads == 2
    assert machine.used[1] / sum(machine.used.values()) < 0.02


def test_not_tunable_keeps_the_budget() -> None:
    machine = Machine(2, two_cores(lambda _: True), tunable=False)
    machine.run(30)
    assert machine.applied == [2]
    assert machine.tuner.trials == 0


def test_budget_one_never_changes() -> None:
    machine = Machine(1, lambda now, n: 0.05)
    machine.run(30)
    assert machine.applied == [1]


def test_explicit_threads_are_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(thread_tuner, "cpu_budget", lambda: 8)
    applied: list[int] = []
    policy = thread_policy(3, applied.append, lambda: True)
    assert isinstance(policy, PinnedThreads)
    for _ in range(1000):
        policy.before_step(1)
        policy.after_step(1.0)
    assert applied == [3]


def test_zero_threads_tunes_from_the_cpu_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(thread_tuner, "cpu_budget", lambda: 6)
    applied: list[int] = []
    policy = thread_policy(0, applied.append, lambda: True)
    assert isinstance(policy, ThreadTuner)
    assert policy.budget == 6
    assert applied == [6]


def test_idle_cpus_gate_the_probes_for_more_threads() -> None:
    """While neighbours keep every CPU busy, two threads are probed only once per FORCE_MORE_S (one
    step each); once a CPU is idle again, the next check (a second or two) probes and wins."""
    neighbour = lambda now: 5 <= now < 65  # noqa: E731
    machine: Machine

    def idle() -> float | None:
        return 0.0 if neighbour(machine.now) else 2.0 - machine.current

    machine = Machine(2, two_cores(neighbour), idle=idle)
    machine.run(10)
    assert machine.tuner.threads == 1
    before = Counter(machine.used)
    machine.run(55)
    assert machine.tuner.threads == 1
    assert machine.used[2] - before[2] <= 55 / FORCE_MORE_S + 1, "two threads probed while no CPU is idle"
    machine.run(2.5)
    assert machine.tuner.threads == 2


def test_slower_steps_at_one_thread_do_not_probe_more() -> None:
    """A drift towards slower steps means less CPU to share: it never triggers a probe upward."""
    slower_from = [1e9]
    machine = Machine(2, lambda now, n: {1: 0.06 if now < slower_from[0] else 0.12, 2: 0.5}[n])
    machine.run(60)  # the probes upward have backed off to one per MAX_INTERVAL_S
    assert machine.tuner.threads == 1
    scheduled = machine.tuner._next_trial
    slower_from[0] = machine.now
    trials = machine.tuner.trials
    machine.run(scheduled - machine.now - 0.2)
    assert machine.tuner.trials == trials


def test_a_partial_neighbour_that_keeps_the_gate_shut_still_gets_two_threads_back() -> None:
    """Heavy contention first (one thread wins), then a neighbour using part of a CPU: too little idle
    time to open the gate, yet two threads are faster again; the forced probe finds it."""
    heavy = lambda now: now < 10  # noqa: E731
    machine = Machine(2, lambda now, n: (BUSY if heavy(now) else {1: 0.060, 2: 0.045})[n], idle=lambda: 0.3)
    machine.run(10)
    assert machine.tuner.threads == 1
    machine.run(FORCE_MORE_S + 2)
    assert machine.tuner.threads == 2


def test_a_neighbour_arriving_at_a_batch_size_no_trial_has_seen_is_still_noticed() -> None:
    """The last trials ran at 4 rows; the neighbour comes while single requests run, long before the
    next scheduled trial: the drift from the first one-row steps triggers it."""
    arrival = [1e9]
    machine = Machine(2, two_cores(lambda now: now >= arrival[0]))
    machine.run(30, rows=lambda _: 4)
    while machine.tuner._next_trial - machine.now < 6:  # right after a scheduled trial
        machine.run(0.05, rows=lambda _: 4)
    trials = machine.tuner.trials
    machine.run(1)  # one row, quiet: its first steps become the figure to drift from
    arrival[0] = machine.now
    machine.run(3)
    assert machine.tuner.trials > trials
    assert machine.tuner.threads == 1
