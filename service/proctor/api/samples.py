"""n sampled completions of one request (``num_return_sequences`` > 1 without beam search).

Each completion is an ordinary generation of its own — its own audit record (replayable alone), its own
seed derived from the request's (``attempt_seed``: completion ``k`` of a request seeded ``s``), run
concurrently so the engine batches them — and the response is the first completion with every one in
``sequences`` (text, tokens, score = the sum of its tokens' log-probabilities under the distribution
it was sampled from, finish reason, audit id). A stream with ``n`` > 1 arrives whole at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from typing import Any

from proctor.api.audited_calls import AuditedCalls, BeforeCommit
from proctor.api.call_info import CallInfo
from proctor.audit.records import CallRecord
from proctor.domain import GenerationRequest, ReturnedSequence, TokenEvent
from proctor.domain.seeds import attempt_seed


def wants_samples(request: GenerationRequest) -> bool:
    return request.num_return_sequences > 1 and request.sampling.num_beams <= 1


async def sample_events(calls: AuditedCalls[Any], method: str, request: GenerationRequest,
                        info: CallInfo) -> tuple[list[TokenEvent], str]:
    """The first completion's events (its final event carrying every completion) and its audit id."""
    count = request.num_return_sequences
    seed = request.sampling.seed if request.sampling.seed is not None else secrets.randbits(63)
    completions = [dataclasses.replace(
        request, request_id=request.request_id if index == 0 else f"{request.request_id}#{index}",
        sampling=dataclasses.replace(request.sampling, seed=attempt_seed(seed, index + 1)),
        num_return_sequences=1, token_details=True)  # the details give each completion's score
        for index in range(count)]

    def group(index: int) -> BeforeCommit:
        def annotate(call: CallRecord, events: list[TokenEvent]) -> None:
            call.sample = {"group": request.request_id, "index": index, "of": count}
        return annotate

    running = [asyncio.ensure_future(calls.run_call(method, completion, info, group(index)))
               for index, completion in enumerate(completions)]
    try:
        results = await asyncio.gather(*running)
    except BaseException:  # one failing fails the call: the others are cancelled (and recorded as such)
        for task in running:
            task.cancel()
        raise
    sequences = tuple(_returned(events, audit_id) for events, audit_id in results)
    first, audit_id = results[0]
    return [*first[:-1], dataclasses.replace(first[-1], sequences=sequences)], audit_id


def _returned(events: list[TokenEvent], audit_id: str) -> ReturnedSequence:
    final = events[-1]
    assert final.finish_reason is not None
    score = sum(detail.final_logprob for event in events for detail in event.details)
    return ReturnedSequence(tuple(t for e in events for t in e.token_ids), "".join(e.text for e in events), score,
                            final.finish_reason, audit_id, tuple(d for e in events for d in e.details), final.receipt)
