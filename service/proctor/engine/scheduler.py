"""Admission: a bounded waiting queue in front of the running batch.

Today a new group is admitted only when the batch is empty (static batching, up to
``max_batch_size``, default 1); continuous batching will admit at every step boundary.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from proctor.domain import Overloaded
from proctor.engine.sequence import SequenceState


class Scheduler:
    def __init__(self, max_batch_size: int, max_waiting: int) -> None:
        self.max_batch_size = max(1, max_batch_size)
        self.max_waiting = max_waiting
        self._waiting: deque[SequenceState] = deque()
        self._lock = threading.Lock()

    def enqueue(self, state: SequenceState) -> None:
        with self._lock:
            if len(self._waiting) >= self.max_waiting:
                raise Overloaded(f"the waiting queue is full ({self.max_waiting} requests); retry later")
            self._waiting.append(state)

    def take_group(self, running: int) -> list[SequenceState]:
        """Waiting sequences to prefill now (empty while a batch is running)."""
        if running:
            return []
        with self._lock:
            group = []
            while self._waiting and len(group) < self.max_batch_size:
                group.append(self._waiting.popleft())
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
