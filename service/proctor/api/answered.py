"""What a call answers, whichever door it goes out through: the events as its caller gets them.

The call layer (api/generation_service.py) gives a unary call's ``Answer`` or a stream's ``Released`` events, each
with the call's checked request and audit id; each door writes them in its own form (protobuf: api/convert.py;
OpenAI's JSON: openai_http/answers.py). The per-token details are the caller's as it asked for them
(``asked_details``): the engine may compute more, for the audit record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from proctor.domain import GenerationRequest, TokenDetail, TokenEvent


@dataclass(frozen=True, slots=True)
class Answer:
    """A unary call's answer: its checked request, the events its caller gets, its audit id."""

    request: GenerationRequest
    events: list[TokenEvent]
    audit_id: str


@dataclass(frozen=True, slots=True)
class Released:
    """One event of a stream as its caller gets it, with the call's checked request and audit id."""

    event: TokenEvent
    request: GenerationRequest
    audit_id: str


def asked_details(details: Iterable[TokenDetail], request: GenerationRequest | None) -> list[TokenDetail]:
    """Per-token details as the caller asked for them: none unless it asked (``token_details`` or
    ``top_logprobs``), each with at most ``top_logprobs`` alternatives (``request`` None: all of them)."""
    if request is None:
        return list(details)
    if not (request.token_details or request.top_logprobs > 0):
        return []
    top = request.top_logprobs
    return [d if len(d.top_logprobs) <= top else dataclasses.replace(d, top_logprobs=d.top_logprobs[:top])
            for d in details]
