"""The one registry of the requests the engine holds, by id, from submit until their final event goes out.

A request id names at most one live request. A request on the validated fallback is held as its attempts
(engine/attempts.py) for its whole life, and as a sequence state while one of its attempts runs; every
other request is held as its state alone. Any thread may look a request up (to abort it) or count them;
the engine thread adds and forgets them.
"""

from __future__ import annotations

import threading

from proctor.domain import RequestValidationError
from proctor.engine.attempts import FallbackAttempts
from proctor.engine.sequence import SequenceState


def _running(request_id: str) -> RequestValidationError:
    return RequestValidationError.single("request_id", f"request {request_id!r} is already running")


class LiveRequests:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, SequenceState] = {}
        self._attempts: dict[str, FallbackAttempts] = {}

    def add_attempts(self, request_id: str, attempts: FallbackAttempts) -> None:
        """Hold a request on the validated fallback (before its first attempt starts)."""
        with self._lock:
            if request_id in self._states or request_id in self._attempts:
                raise _running(request_id)
            self._attempts[request_id] = attempts

    def add_state(self, state: SequenceState) -> None:
        """Hold a sequence's state: a request's own, or the running attempt of one held by ``add_attempts``."""
        with self._lock:
            if state.request_id in self._states:
                raise _running(state.request_id)
            self._states[state.request_id] = state

    def get(self, request_id: str) -> SequenceState | None:
        with self._lock:
            return self._states.get(request_id)

    def forget_state(self, state: SequenceState) -> None:
        """Let go of ``state`` (its final event is about to go out: the id may be reused at once)."""
        with self._lock:
            if self._states.get(state.request_id) is state:
                del self._states[state.request_id]

    def forget_attempts(self, request_id: str) -> None:
        with self._lock:
            self._attempts.pop(request_id, None)

    def abort(self, request_id: str) -> bool:
        """Ask the request to end (CANCELLED within a step; no further fallback attempt starts)."""
        with self._lock:
            state, attempts = self._states.get(request_id), self._attempts.get(request_id)
        if attempts is not None:
            attempts.cancelled = True
        if state is not None:
            state.abort_requested = True
        return state is not None or attempts is not None

    def abort_all(self) -> None:
        with self._lock:
            for state in self._states.values():
                state.abort_requested = True

    def counts(self) -> tuple[int, int]:
        """(requests with a live state, requests on the fallback)."""
        with self._lock:
            return len(self._states), len(self._attempts)
