"""Continuous batching on the real model over gRPC: a request's output does not depend on its company.

16 concurrent streams with different prompts, lengths and parameters (JSON schema, regex, choice,
forbidden phrases, stop strings, seeded sampling, logprobs) must each produce exactly the tokens they
produce alone. A full waiting queue answers RESOURCE_EXHAUSTED at once, with a retry hint.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import grpc
import pytest

from proctor.config import Settings
from proctor_client import AsyncProctorClient, ProctorClient, ProctorError

pytestmark = pytest.mark.real_model

CLAUSE = "The Receiving Party shall keep the Confidential Information secret and use it only for the Purpose. "
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("Write a haiku about the sea.", {"max_new_tokens": 12}),
    ("List three fruits:", {"max_new_tokens": 30, "forbidden": ["apple", "banana"]}),
    ("Describe a person as JSON.", {"max_new_tokens": 60, "json_schema": SCHEMA}),
    ("Summarise: " + CLAUSE * 4, {"max_new_tokens": 25}),
    ("What is the capital of France?", {"max_new_tokens": 8, "top_logprobs": 3}),
    ("Pick a colour.", {"max_new_tokens": 10, "choice": ["red", "green", "blue"]}),
    ("A phone number:", {"max_new_tokens": 20, "regex": r"\+44 [0-9]{4} [0-9]{6}"}),
    ("Tell me a story about a dragon.", {"max_new_tokens": 40, "stop": ["."]}),
    ("Count from one to ten in words:", {"max_new_tokens": 35, "min_new_tokens": 35}),
    ("Random words:", {"max_new_tokens": 20, "temperature": 0.9, "top_p": 0.9, "seed": 1234}),
    ("Explain what a contract is.", {"max_new_tokens": 18, "forbidden": ["agreement"], "forbidden_whole_word": True}),
    ("你好，请介绍一下你自己。", {"max_new_tokens": 15}),
    ("Give a JSON list of two cities.", {"max_new_tokens": 40,
                                        "json_schema": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                                        "minItems": 2, "maxItems": 2}}),
    ("Translate to French: good morning", {"max_new_tokens": 9, "repetition_penalty": 1.3}),
    ("Name a planet.", {"max_new_tokens": 5}),
    ("Write a limerick about a cat. " + CLAUSE * 2, {"max_new_tokens": 30, "temperature": 0.7, "seed": 99}),
]


def _tokens_alone(client: ProctorClient) -> list[list[int]]:
    return [list(client.generate(prompt, temperature=kwargs.pop("temperature", 0), **kwargs).token_ids)
            for prompt, kwargs in ((p, dict(k)) for p, k in REQUESTS)]


async def _tokens_together(address: str) -> list[list[int]]:
    async with AsyncProctorClient(address, timeout_s=300) as client:

        async def one(prompt: str, kwargs: dict[str, Any]) -> list[int]:
            kwargs = dict(kwargs)
            ids: list[int] = []
            async for chunk in client.stream_generate(prompt, temperature=kwargs.pop("temperature", 0), **kwargs):
                ids.extend(chunk.token_ids)
            return ids

        return list(await asyncio.gather(*(one(p, k) for p, k in REQUESTS)))


def test_sixteen_concurrent_streams_match_their_solo_runs(server: Any, client: ProctorClient) -> None:
    alone = _tokens_alone(client)
    engine = server.running.engine
    widest = {"rows": 0}
    stop = threading.Event()

    def watch() -> None:  # how many requests actually shared a step
        while not stop.is_set():
            widest["rows"] = max(widest["rows"], len(engine._batch))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        together = asyncio.run(_tokens_together(server.address))
    finally:
        stop.set()
        watcher.join()
    assert widest["rows"] >= 10, f"the requests did not run together (widest batch {widest['rows']})"
    for index, (solo, batched) in enumerate(zip(alone, together, strict=True)):
        assert solo, f"request {index} produced nothing alone"
        assert batched == solo, f"request {index} ({REQUESTS[index][0][:30]!r}) differs in a batch: {batched} vs {solo}"


@pytest.fixture(scope="module")
def narrow_server(model_dir: Any) -> Any:
    """One running request, one waiting: the third is refused."""
    from proctor.app import BackgroundServer

    background = BackgroundServer(Settings.load({"port": 0, "max_batch_size": 1, "max_waiting": 1, "audit": False,
                                                 "warmup": False}))
    background.start(timeout_s=300)
    yield background
    background.stop()


def test_full_queue_answers_resource_exhausted_at_once(narrow_server: Any) -> None:
    with ProctorClient(narrow_server.address, timeout_s=120, retries=0) as client:
        running = client.stream_generate("Tell me a long story.", max_new_tokens=400, min_new_tokens=400)
        next(running)  # the first request holds the only slot
        waiting: dict[str, Any] = {}

        def wait_in_queue() -> None:
            waiting["response"] = client.generate("Hi", max_new_tokens=2)

        thread = threading.Thread(target=wait_in_queue)
        thread.start()
        engine = narrow_server.running.engine
        end = time.monotonic() + 30
        while engine._scheduler.waiting_count() < 1 and time.monotonic() < end:
            time.sleep(0.01)
        assert engine._scheduler.waiting_count() == 1
        begin = time.perf_counter()
        with pytest.raises(ProctorError) as refused:
            client.generate("Hello", max_new_tokens=2)
        elapsed = time.perf_counter() - begin
        assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "waiting queue is full" in str(refused.value)
        assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0
        assert elapsed < 1.0, f"the refusal took {elapsed:.2f} s"
        running.close()  # cancels the running call: its slot goes to the waiting request
        thread.join(120)
        assert waiting["response"].usage.completion_tokens == 2  # the waiting one ran once the slot was free


def test_a_rows_logits_are_bit_identical_alone_and_in_a_batch(server: Any) -> None:
    """Stronger than equal greedy tokens: the logits themselves do not depend on the batch."""
    import torch
    from helpers.slots import feed_prompt, feed_prompts, feed_step

    from proctor.executor.slot_forward import SlotForward

    loaded = server.running.engine.loaded
    prompts = [r[0] for r in REQUESTS[:8]]
    rows = [loaded.tokenizer(p)["input_ids"] for p in prompts]
    with torch.inference_mode():
        alone = []
        for ids in rows:
            solo = SlotForward(loaded.model, 1, loaded.device, loaded.weights)  # the weights the server built
            first = feed_prompt(solo, 0, ids)
            alone.append((first, feed_step(solo, [int(first.argmax())]), feed_step(solo, [7])))
        batch = SlotForward(loaded.model, 8, loaded.device, loaded.weights)
        firsts = feed_prompts(batch, rows)
        seconds = feed_step(batch, [int(t) for t in firsts.argmax(-1)])
        thirds = feed_step(batch, [7] * len(rows))
    for i, (first, second, third) in enumerate(alone):
        assert torch.equal(firsts[i], first[0]), f"prefill logits of row {i}"
        assert torch.equal(seconds[i], second[0]), f"first decode step, row {i}"
        assert torch.equal(thirds[i], third[0]), f"second decode step, row {i}"
