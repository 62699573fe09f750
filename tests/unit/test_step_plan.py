"""The step plan (engine/scheduler.py): the scheduler decides a step as data and changes nothing; the engine
applies it (engine/step.py).

What must hold: planning leaves the batch, the waiting queue, every request's status and prompt position and the
prefix cache as they were; the plan is frozen data; the requests that leave free their rows for the joiners of the
same step; a joiner's first feed starts after what the prefix cache holds of its prompt.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from helpers.engine import Collector

from proctor.domain import FinishReason, GenerationRequest, SamplingParams, StoppingParams
from proctor.engine.scheduler import StepPlan

LONG = " ".join(f"clause {i} of the agreement," for i in range(30))


def request(request_id: str, prompt: str, n: int, **fields: Any) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, prompt=prompt,
                             stopping=StoppingParams(max_new_tokens=n, ignore_eos=True), **fields)


def snapshot(engine: Any) -> tuple[Any, ...]:
    """Everything a plan could change: who is in the batch and the queue, and where each request stands."""
    batch = engine._batch
    queue = list(engine._scheduler._waiting)
    states = [*batch.states, *(search.host for search in batch.searches), *queue]
    cache = dataclasses.astuple(engine.prefix_cache.counts)
    return ([id(s) for s in batch.states], [(id(s.host), list(s.slots)) for s in batch.searches],
            [id(s) for s in queue], [(s.status, s.prompt_fed, len(s.generated), s.finished) for s in states],
            cache, len(engine.prefix_cache))


def recording(engine: Any) -> list[StepPlan]:
    """Wrap the scheduler's ``plan``: each call is checked to change nothing, and its plan kept."""
    plans: list[StepPlan] = []
    original = engine._scheduler.plan

    def plan(*args: Any, **kwargs: Any) -> StepPlan:
        before = snapshot(engine)
        made = original(*args, **kwargs)
        assert snapshot(engine) == before, "planning changed the engine"
        plans.append(made)
        return made

    engine._scheduler.plan = plan
    return plans


def run_steps(engine: Any, limit: int = 400) -> None:
    with torch.inference_mode():
        for _ in range(limit):
            if not engine._step():
                break


def test_planning_changes_nothing_and_the_plan_is_frozen(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False, max_batch_size=4, max_step_tokens=24, speculation="on")
    sinks = {name: Collector() for name in ("a", "long", "beams", "c", "d")}
    prompts = {"a": "Hi", "long": LONG, "beams": "The printing press", "c": "Hello there", "d": LONG}
    for name, sink in sinks.items():
        extra = {"sampling": SamplingParams(num_beams=2)} if name == "beams" else {}
        engine.submit(engine.prepare(request(name, prompts[name], 6, **extra)), sink)
    plans = recording(engine)
    run_steps(engine)
    assert all(sink.done.is_set() and sink.final.error is None for sink in sinks.values())
    assert sum(len(plan.join) for plan in plans) == len(sinks)
    assert any(feed.beam is not None for plan in plans for feed in plan.feeds)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plans[0].feeds = ()  # type: ignore[misc]


def test_a_leaving_row_is_free_for_a_joiner_of_the_same_step(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False, max_batch_size=1)
    first, second = Collector(), Collector()
    engine.submit(engine.prepare(request("first", "Hi", 50)), first)
    engine.submit(engine.prepare(request("second", "Hello", 3)), second)
    plans = recording(engine)
    with torch.inference_mode():
        engine._step()
        engine._step()
    assert first.token_ids and not second.events
    engine.abort("first")
    run_steps(engine)
    leaving = next(plan for plan in plans if plan.leaving)
    assert [(state.request_id, reason) for state, reason in leaving.leaving] == [("first", FinishReason.CANCELLED)]
    assert [join.state.request_id for join in leaving.join] == ["second"]
    assert first.final.finish_reason is FinishReason.CANCELLED and len(second.token_ids) == 3


def test_a_cancelled_waiting_request_leaves_the_queue_without_joining(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False, max_batch_size=1)
    running, waiting = Collector(), Collector()
    engine.submit(engine.prepare(request("running", "Hi", 4)), running)
    engine.submit(engine.prepare(request("waiting", "Hello", 4)), waiting)
    plans = recording(engine)
    with torch.inference_mode():
        engine._step()
    engine.abort("waiting")
    run_steps(engine)
    assert waiting.final.finish_reason is FinishReason.CANCELLED and not waiting.token_ids
    assert not any(join.state.request_id == "waiting" for plan in plans for join in plan.join)
    assert len(running.token_ids) == 4 and engine._scheduler.waiting_count() == 0


def test_a_joiners_first_feed_starts_after_its_cached_prefix(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False, max_batch_size=2, prefill_chunk_tokens=16, max_step_tokens=512)
    outputs = []
    plans = recording(engine)
    for name in ("cold", "warm"):
        sink = Collector()
        engine.submit(engine.prepare(request(name, LONG, 4, prefix_cache_scope="")), sink)
        run_steps(engine)
        outputs.append(sink.token_ids)
    cold, warm = (next(join for plan in plans for join in plan.join if join.state.request_id == name)
                  for name in ("cold", "warm"))
    assert cold.prefix.tokens == 0 and warm.prefix.tokens > 0 and warm.prefix.tokens % 16 == 0
    feed = next(feed for plan in plans for feed in plan.feeds if feed.state is warm.state)
    assert feed.tokens == warm.state.prompt_ids[warm.prefix.tokens:][:len(feed.tokens)] and feed.completes
    assert outputs[0] == outputs[1]
