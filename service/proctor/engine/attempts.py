"""The validated fallback's retry loop: generate under the relaxed schema, validate, retry while attempts remain.

A JSON schema that no engine enforces exactly is compiled as a documented superset (see
``constraints/json_schema/relaxed.py``). Each attempt's events are held back until the attempt ends
and its output has been validated against the full schema: a valid output is released (with every
attempt listed on its final event); an invalid one starts the next attempt, until the attempts are
spent — then the last output is released with ``schema_validation.valid = false`` and a finish
detail that says so, never as valid. Streams on this path therefore arrive whole at the end.

Attempt 1 runs with the request's own settings and seed; attempt ``k`` uses a seed derived from
the request's (``attempt_seed``) and, for a greedy request, ``fallback_temperature`` (a greedy
retry would repeat itself). The final event reports the request's seed, so replaying the record
runs the same attempts and returns the same output.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from proctor.domain import Attempt, FinishReason, TokenEvent
from proctor.domain.seeds import attempt_seed
from proctor.engine.preprocess import PreparedRequest

# Attempts end for good on these: the caller went away, time ran out, or the engine failed.
FINAL_REASONS = frozenset({FinishReason.CANCELLED, FinishReason.DEADLINE, FinishReason.ERROR})
EventSink = Callable[[TokenEvent], None]
StartAttempt = Callable[[PreparedRequest, int, EventSink, float], None]


class FallbackAttempts:
    """One request's attempts; ``sink`` gets only the released attempt's events."""

    def __init__(self, prepared: PreparedRequest, seed: int, sink: EventSink, *, most_attempts: int,
                 retry_temperature: float, start: StartAttempt, on_done: Callable[[], None] = lambda: None) -> None:
        self._prepared = prepared
        self._seed = seed
        self._sink = sink
        self._most = max(1, most_attempts)
        self._retry_temperature = retry_temperature
        self._start = start
        self._created = time.monotonic()
        self._attempts: list[Attempt] = []
        self._held: list[TokenEvent] = []
        self._on_done = on_done
        self.cancelled = False  # set by Engine.abort: no further attempt starts

    def begin(self) -> None:
        self._launch(1)

    def _temperature(self, number: int) -> float:
        """Attempt ``number``'s temperature: the request's, but a greedy request's retries sample."""
        sampling = self._prepared.request.sampling
        return self._retry_temperature if number > 1 and sampling.greedy else sampling.temperature or 0.0

    def _launch(self, number: int) -> None:
        request = self._prepared.request
        seed = attempt_seed(self._seed, number)
        sampling = dataclasses.replace(request.sampling, temperature=self._temperature(number) or None, seed=seed)
        changed = dataclasses.replace(request, sampling=sampling)
        self._held = []
        self._start(dataclasses.replace(self._prepared, request=changed), seed, self._receive, self._created)

    def _receive(self, event: TokenEvent) -> None:
        self._held.append(event)
        if not event.finished:
            return
        number = len(self._attempts) + 1
        check = event.schema_check
        valid = check is not None and check.valid
        assert event.finish_reason is not None
        self._attempts.append(Attempt(number, attempt_seed(self._seed, number), self._temperature(number),
                                      event.usage.completion_tokens if event.usage else 0, event.finish_reason,
                                      valid, check.errors if check else ()))
        if valid or number >= self._most or event.finish_reason in FINAL_REASONS or event.error:
            self._release(event, valid, number)
            return
        if self.cancelled:  # the caller went away between two attempts
            self._release(event, valid, number, why="cancelled before a retry")
            return
        try:
            self._launch(number + 1)
        except Exception as exc:  # overloaded or shutting down: the last output stands, said plainly
            self._release(event, valid, number, why=f"no retry possible ({exc})")

    def _release(self, final: TokenEvent, valid: bool, number: int, why: str = "") -> None:
        detail = final.finish_detail
        if not valid and final.finish_reason not in FINAL_REASONS:
            note = f"no valid output in {number} attempt{'s' if number > 1 else ''}"
            note += f"; {why}" if why else ""
            detail = f"{detail}; {note}" if detail else note
        self._on_done()
        for event in self._held[:-1]:
            self._sink(event)
        self._sink(dataclasses.replace(final, finish_detail=detail, seed=self._seed, attempts=tuple(self._attempts)))
