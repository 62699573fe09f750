"""A request's place in the engine, said once (in the style of vLLM v1's ``RequestStatus``).

    WAITING ──▶ PREFILLING ──▶ RUNNING ──▶ FINISHED_STOPPED | FINISHED_LENGTH | FINISHED_FAILED
       │            │             │
       └────────────┴─────────────┴──────▶ ABORTED   (the caller went away, or its deadline passed)

PREFILLING is a long prompt's chunked prefill (engine/batch.py); a short prompt joins the batch in one
step, WAITING → RUNNING. A beam search is RUNNING from the step it starts. Each request's state
(engine/sequence.py) holds its status; the engine changes it at each transition and nowhere else
decides from flags where a request is.
"""

from __future__ import annotations

import enum

from proctor.domain import FinishReason


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    RUNNING = "running"
    FINISHED_STOPPED = "finished_stopped"  # ended as asked: an end token, a stop, the constraint complete
    FINISHED_LENGTH = "finished_length"  # reached max_new_tokens (or the context)
    FINISHED_FAILED = "finished_failed"  # no allowed token left, a forbidden phrase, a plugin or engine error
    ABORTED = "aborted"  # cancelled by the caller or past its deadline

    @property
    def finished(self) -> bool:
        return self in _ENDED


_ENDED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_FAILED,
                    RequestStatus.ABORTED})
_BY_REASON: dict[FinishReason, RequestStatus] = {
    FinishReason.LENGTH: RequestStatus.FINISHED_LENGTH,
    FinishReason.CANCELLED: RequestStatus.ABORTED,
    FinishReason.DEADLINE: RequestStatus.ABORTED,
    FinishReason.ERROR: RequestStatus.FINISHED_FAILED,
    FinishReason.DEAD_END: RequestStatus.FINISHED_FAILED,
    FinishReason.FORBIDDEN_PHRASE: RequestStatus.FINISHED_FAILED,
}


def status_after(reason: FinishReason) -> RequestStatus:
    """The status a request ends in when it finishes for ``reason``."""
    return _BY_REASON.get(reason, RequestStatus.FINISHED_STOPPED)
