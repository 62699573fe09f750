"""The watchdog: a wedge never goes silent.

Every ``CHECK_INTERVAL_S`` it asks each watched part whether it is making progress:

- the engine: work is pending (waiting, staged, running or beam requests) and its step counter has
  not moved for ``stall_s`` seconds (a step that never returns, or a loop that stopped taking work);
- the audit writer: its thread has died, or records have waited ``stall_s`` seconds without the
  writer taking any.

A part stalled for ``stall_s`` is logged as an ERROR (what is stuck, and the admission counters) and
the server's health goes NOT_SERVING, so an orchestrator restarts it instead of every call waiting
out its deadline; health comes back, with an INFO line, once the part moves again. Pure logic: the
app runs ``check`` on its event loop and publishes ``wedged`` in its health (app.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger("proctor.watchdog")
CHECK_INTERVAL_S = 1.0


class Watched(Protocol):
    """One part the watchdog asks: ``stalled_for(now)`` is None while it moves, else why it does not."""

    name: str

    def stalled_for(self, now: float) -> tuple[float, str] | None: ...


class EngineView(Protocol):
    def progress(self) -> tuple[bool, int]: ...
    def admission_counts(self) -> dict[str, int]: ...


class SinkView(Protocol):
    @property
    def alive(self) -> bool: ...
    def stalled_s(self, now: float | None = None) -> float: ...
    def depth(self) -> int: ...


@dataclass
class EngineProgress:
    """The engine is stalled when work is pending and its step counter stays put."""

    engine: EngineView
    name: str = "engine"
    _steps: int = -1
    _since: float | None = None  # when the work now pending was first seen with the step counter at _steps

    def stalled_for(self, now: float) -> tuple[float, str] | None:
        pending, steps = self.engine.progress()
        if not pending:
            self._since = None
            return None
        if steps != self._steps or self._since is None:
            self._steps, self._since = steps, now
            return None
        counts = ", ".join(f"{k}={v}" for k, v in self.engine.admission_counts().items())
        return now - self._since, f"work is pending and no step has run for {now - self._since:.0f} s ({counts})"


@dataclass
class WriterProgress:
    """The audit writer is stalled when its thread is gone or records wait without being taken."""

    sink: SinkView
    name: str = "audit writer"

    def stalled_for(self, now: float) -> tuple[float, str] | None:
        if not self.sink.alive:  # a dead writer never recovers: reported at once, whatever the threshold
            return float("inf"), f"its thread has stopped ({self.sink.depth()} records queued)"
        waited = self.sink.stalled_s(now)
        if waited <= 0:
            return None
        return waited, f"{self.sink.depth()} records queued and none taken for {waited:.0f} s"


@dataclass
class Watchdog:
    """Which watched parts are wedged now (empty: all move); ``check`` updates it and logs the changes."""

    parts: list[Watched]
    stall_s: float
    wedged: dict[str, str] = field(default_factory=dict)  # part name -> why, while wedged

    def check(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for part in self.parts:
            verdict = part.stalled_for(now)
            if verdict is not None and verdict[0] >= self.stall_s:
                if part.name not in self.wedged:
                    log.error("watchdog: the %s is stuck: %s; health NOT_SERVING", part.name, verdict[1])
                self.wedged[part.name] = verdict[1]
            elif part.name in self.wedged:
                del self.wedged[part.name]
                log.info("watchdog: the %s makes progress again", part.name)
