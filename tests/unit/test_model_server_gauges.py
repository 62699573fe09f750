"""The model-server protocol's gauges (issue 58): ``proctor:kv_cache_usage_perc`` and ``proctor:cache_config_info``
as the real metrics collector reads them from the real tiny engine, stepped by hand so every reading is taken at a
known point (nothing races the engine thread).

What must hold: the usage is the fraction of the KV-cache budget the running requests hold (0 idle, growing as they
generate, 0 again when they leave); the cache info names the prefix cache's chunk and the number of chunks it holds
once full (an eviction has happened, so the count is the cache's, not arithmetic repeated here); no cache info before
the executor is built, and 0/0 without a prefix cache.
"""

from __future__ import annotations

from typing import Any

import torch
from helpers.engine import Collector

from proctor.domain import GenerationRequest, StoppingParams
from proctor.observability.collectors import CACHE_CONFIG_LABELS, StateCollector, usage_fraction

LONG = " ".join(f"clause {i} of the agreement," for i in range(30))
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def gauges(engine: Any) -> Samples:
    """Every sample the metrics collector yields for ``engine`` (what a scrape would show)."""
    collector = StateCollector()
    collector.engine = engine
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in collector.collect() for sample in family.samples}


def value(samples: Samples, name: str) -> float:
    return samples[("proctor:" + name, ())]


def cache_info(samples: Samples) -> dict[str, int] | None:
    """The labels of ``proctor:cache_config_info`` as ints (None: no sample), checking its value is 1."""
    found = [(labels, v) for (name, labels), v in samples.items() if name == "proctor:cache_config_info"]
    if not found:
        return None
    assert len(found) == 1 and found[0][1] == 1
    labels = dict(found[0][0])
    assert set(labels) == set(CACHE_CONFIG_LABELS)
    return {key: int(text) for key, text in labels.items()}


def request(request_id: str, prompt: str, n: int, **fields: Any) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, prompt=prompt,
                             stopping=StoppingParams(max_new_tokens=n, ignore_eos=True), **fields)


def step(engine: Any, times: int) -> None:
    with torch.inference_mode():
        for _ in range(times):
            engine._step()


def run_steps(engine: Any, limit: int = 2000) -> None:
    with torch.inference_mode():
        for _ in range(limit):
            if not engine._step():
                return
    raise AssertionError("the engine still had work after the step limit")


def test_the_usage_is_the_fraction_of_the_budget_the_running_requests_hold(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False, max_batch_size=1, kv_cache_mb=1)
    idle = gauges(engine)
    assert value(idle, "kv_cache_usage_perc") == 0 and cache_info(idle) is None  # no executor built yet
    first, second = Collector(), Collector()
    engine.submit(engine.prepare(request("first", LONG, 60)), first)
    engine.submit(engine.prepare(request("second", "Hello", 4)), second)
    queued = gauges(engine)
    assert (value(queued, "num_requests_waiting"), value(queued, "num_requests_running")) == (2, 0)
    assert value(queued, "kv_cache_usage_perc") == 0

    readings = []
    for _ in range(2):
        step(engine, 10)
        samples = gauges(engine)
        assert (value(samples, "num_requests_waiting"), value(samples, "num_requests_running")) == (1, 1)
        used, total = value(samples, "kv_cache_used_bytes"), value(samples, "kv_cache_total_bytes")
        assert total == 1024 * 1024 and 0 < used < total
        assert value(samples, "kv_cache_usage_perc") == used / total
        readings.append(value(samples, "kv_cache_usage_perc"))
    assert readings[1] > readings[0]  # ten more tokens each held in the cache

    run_steps(engine)
    assert len(first.token_ids) == 60 and len(second.token_ids) == 4
    done = gauges(engine)
    assert value(done, "kv_cache_usage_perc") == 0 and value(done, "num_requests_running") == 0


def test_the_usage_stays_a_fraction() -> None:
    assert usage_fraction(0, 0) == 0.0  # no engine yet
    assert usage_fraction(1, 4) == 0.25
    assert usage_fraction(5, 4) == 1.0  # a request admitted alone may hold more than the budget


def test_the_cache_info_names_the_chunk_and_the_chunks_the_full_prefix_cache_holds(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False, prefill_chunk_tokens=32, prefix_cache_mb=1, max_step_tokens=512)
    sink = Collector()
    engine.submit(engine.prepare(request("p0", f"Prompt 0: {LONG}", 1, prefix_cache_scope="")), sink)
    run_steps(engine)
    info = cache_info(gauges(engine))
    assert info is not None and info["block_size"] == 32
    chunks = sink.final.usage.prompt_tokens // 32
    assert chunks >= 2 and len(engine.prefix_cache) == chunks
    chunk_bytes = value(gauges(engine), "prefix_cache_bytes") / chunks
    assert info["num_blocks"] == 1024 * 1024 // chunk_bytes

    n = 1
    while gauges(engine)[("proctor:prefix_cache_evictions_total", ())] == 0:  # fill it past its budget
        assert n < 200, "the prefix cache never filled"
        engine.submit(engine.prepare(request(f"p{n}", f"Prompt {n}: {LONG}", 1, prefix_cache_scope="")), Collector())
        run_steps(engine)
        n += 1
    assert len(engine.prefix_cache) == info["num_blocks"]  # what the full cache holds, not more, not fewer
    assert cache_info(gauges(engine)) == info  # the shape does not change with what is cached


def test_without_a_prefix_cache_the_info_says_zero_blocks(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False, prefix_cache_mb=0)
    sink = Collector()
    engine.submit(engine.prepare(request("only", LONG, 2, prefix_cache_scope="")), sink)
    run_steps(engine)
    assert sink.final.error is None
    assert cache_info(gauges(engine)) == {"block_size": 0, "num_blocks": 0}
