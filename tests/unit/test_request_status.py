"""A request's status moves WAITING → (PREFILLING →) RUNNING → FINISHED_* or ABORTED, step by step.

The engine is stepped by hand here (no engine thread), so each step's plan and its transitions are seen.
"""

from __future__ import annotations

import pytest
import torch
from helpers.engine import Collector

from proctor.domain import FinishReason, GenerationRequest, StoppingParams
from proctor.engine.status import RequestStatus, status_after

LONG = "Once upon a time, in a small village by the sea, there lived an old fisherman " * 4  # > 32 tokens


def request(request_id: str, prompt: str, n: int) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, prompt=prompt,
                             stopping=StoppingParams(max_new_tokens=n, ignore_eos=True))


def test_statuses_follow_the_step_plan(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False, max_batch_size=4, max_step_tokens=32)
    sinks = {name: Collector() for name in ("short", "long", "gone")}
    for name, prompt, n in (("short", "Hi", 3), ("long", LONG, 6), ("gone", "Hello", 4)):
        engine.submit(engine.prepare(request(name, prompt, n)), sinks[name])
    states = {name: engine.state_of(name) for name in sinks}
    assert all(state is not None and state.status is RequestStatus.WAITING for state in states.values())
    engine.abort("gone")
    with torch.inference_mode():
        assert engine._step()
        assert states["gone"].status is RequestStatus.ABORTED  # type: ignore[union-attr]
        assert sinks["gone"].events[-1].finish_reason is FinishReason.CANCELLED
        assert states["short"].status is RequestStatus.RUNNING  # type: ignore[union-attr]
        assert states["long"].status is RequestStatus.PREFILLING  # type: ignore[union-attr]
        seen = {states["long"].status}  # type: ignore[union-attr]
        for _ in range(40):
            if not engine._step():
                break
            seen.add(states["long"].status)  # type: ignore[union-attr]
    assert RequestStatus.RUNNING in seen  # the long prompt joined the batch after its last chunk
    for name in ("short", "long"):
        assert states[name].status is RequestStatus.FINISHED_LENGTH  # type: ignore[union-attr]
        assert sinks[name].events[-1].finish_reason is FinishReason.LENGTH
        assert engine.state_of(name) is None  # forgotten once its final event went out
    assert engine.active_count() == 0


def test_every_finish_reason_ends_in_a_finished_status() -> None:
    engine_reasons = [r for r in FinishReason if r not in (FinishReason.BLOCKED, FinishReason.MODERATED)]
    assert all(status_after(reason).finished for reason in engine_reasons)
    assert status_after(FinishReason.CANCELLED) is status_after(FinishReason.DEADLINE) is RequestStatus.ABORTED
    assert status_after(FinishReason.EOS) is RequestStatus.FINISHED_STOPPED
    assert status_after(FinishReason.DEAD_END) is RequestStatus.FINISHED_FAILED
    assert not any(s.finished for s in (RequestStatus.WAITING, RequestStatus.PREFILLING, RequestStatus.RUNNING))


def test_a_beam_search_waits_in_the_same_queue_and_joins_with_a_row_a_beam(make_engine) -> None:  # type: ignore[no-untyped-def]
    from proctor.domain import Overloaded, SamplingParams

    engine = make_engine(start=False, max_batch_size=2, max_waiting=1)

    def beams(name: str) -> GenerationRequest:
        return GenerationRequest(request_id=name, prompt="Hi", sampling=SamplingParams(num_beams=2),
                                 stopping=StoppingParams(max_new_tokens=3, ignore_eos=True))

    plain, beam, third = Collector(), Collector(), Collector()
    engine.submit(engine.prepare(request("plain", "Hi", 3)), plain)
    engine.submit(engine.prepare(beams("beam")), beam)  # the queue holds max_waiting plus the free rows
    engine.submit(engine.prepare(beams("third")), third)
    state = engine.state_of("beam")
    assert state is not None and state.status is RequestStatus.WAITING
    with pytest.raises(Overloaded):  # a fourth request finds the queue full, beam search or not
        engine.submit(engine.prepare(beams("fourth")), Collector())
    assert engine.admission_counts()["beams"] == 2 and engine.admission_counts()["waiting"] == 3
    with torch.inference_mode():
        assert engine._step()
        # the plain request took a row; two beams need two: the search waits, and the one behind it too
        assert state.status is RequestStatus.WAITING and engine.admission_counts()["running"] == 1
        for _ in range(20):
            engine._step()
            if state.status is not RequestStatus.WAITING:
                break
        assert plain.events[-1].finish_reason is FinishReason.LENGTH
        assert state.status is RequestStatus.RUNNING and engine._batch.free_rows() == 0  # its prompt, then beams
        for _ in range(40):
            if not engine._step():
                break
    assert state.status is RequestStatus.FINISHED_LENGTH and beam.events[-1].sequences
    assert third.events[-1].sequences and engine.active_count() == 0 and engine._batch.free_rows() == 2


def test_more_beams_than_the_batch_has_rows_is_refused_by_field(make_engine) -> None:  # type: ignore[no-untyped-def]
    from proctor.domain import RequestValidationError, SamplingParams

    engine = make_engine(start=False, max_batch_size=2)
    wide = GenerationRequest(request_id="wide", prompt="Hi", sampling=SamplingParams(num_beams=3),
                             stopping=StoppingParams(max_new_tokens=3))
    with pytest.raises(RequestValidationError) as raised:
        engine.submit(engine.prepare(wide), Collector())
    assert raised.value.violations[0].field == "sampling.num_beams" and "--max-batch-size" in str(raised.value)
    assert engine.admission_counts()["beams"] == 0 and engine.active_count() == 0
