"""Continuous batching on the tiny model: joining, leaving, cancelling, the KV budget, the slot forward.

A request's tokens must not depend on when it joined or who else was running; a cancelled request
frees its slot for the next waiting one within a step; the memory budget holds requests back
instead of failing them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from helpers.engine import Collector
from helpers.slots import feed_prompt, feed_prompts, feed_step

from proctor.domain import FinishReason, GenerationRequest, SamplingParams, StoppingParams
from proctor.executor.build import PerSlotExecutor, make_executor
from proctor.executor.plan import executor_plan
from proctor.executor.protocol import Executor, Feed
from proctor.executor.slot_forward import SlotForward

CPU = torch.device("cpu")

PROMPTS = ["The capital of France is", "Hi", "你好，世界。今天天气很好。",
           "Once upon a time, in a small village by the sea, there lived an old fisherman",
           "1, 2, 3, 4,", "Dear Sir or Madam, I am writing to"]


def cpu_runner(model: Any, slots: int) -> Executor:
    """What a CPU server with dense weights builds for ``model``."""
    return make_executor(executor_plan(model, CPU, "dense"), model, slots)


def request(index: int, n: int, request_id: str, **sampling: object) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, prompt=PROMPTS[index % len(PROMPTS)],
                             sampling=SamplingParams(**sampling),  # type: ignore[arg-type]
                             stopping=StoppingParams(max_new_tokens=n, ignore_eos=True))


def run_alone(engine, req: GenerationRequest) -> list[int]:  # type: ignore[no-untyped-def]
    sink = Collector()
    engine.submit(engine.prepare(req), sink)
    return sink.wait(60) and sink.token_ids


def test_requests_joining_a_running_batch_match_their_solo_runs(make_engine) -> None:  # type: ignore[no-untyped-def]
    specs = [(i, 8 + 5 * i, {"temperature": 0.8, "seed": 7 + i} if i % 3 == 2 else {}) for i in range(12)]
    solo_engine = make_engine(max_batch_size=1)
    alone = [run_alone(solo_engine, request(i, n, f"solo-{i}", **s)) for i, n, s in specs]

    engine = make_engine(max_batch_size=8)
    sinks: list[Collector] = []
    for i, n, s in specs:  # staggered: each joins a batch that is already decoding
        sink = Collector()
        engine.submit(engine.prepare(request(i, n, f"joined-{i}", **s)), sink)
        sinks.append(sink)
        time.sleep(0.01 * (i % 4))
    together = [sink.wait(60) and sink.token_ids for sink in sinks]
    assert together == alone
    assert engine.steps < sum(n for _, n, _ in specs), "the requests never shared a step"


def test_cancelled_request_frees_its_slot_within_a_step(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(max_batch_size=1)
    running, waiting = Collector(), Collector()
    engine.submit(engine.prepare(request(3, 400, "running")), running)
    assert running.first.wait(30)
    steps_at_first_token: list[int] = []

    def waiting_sink(event) -> None:  # type: ignore[no-untyped-def]
        if not steps_at_first_token:
            steps_at_first_token.append(engine.steps)
        waiting(event)

    engine.submit(engine.prepare(request(1, 3, "waiting")), waiting_sink)
    time.sleep(0.05)
    assert not waiting.events, "the waiting request started although the only slot was taken"
    steps_at_cancel = engine.steps
    engine.abort("running")
    waiting.wait(30)
    assert running.wait(30)[-1].finish_reason is FinishReason.CANCELLED
    assert waiting.final.finish_reason is FinishReason.LENGTH
    # The cancel is seen at the next step boundary, where the waiting request joins in the same step.
    assert steps_at_first_token[0] - steps_at_cancel <= 2


def test_kv_budget_holds_requests_back_instead_of_failing_them(make_engine, tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    runner = cpu_runner(tiny_loaded.model, 8)
    engine = make_engine(max_batch_size=8, kv_cache_mb=1, start=False)
    rooms = [len(engine.prepare(request(i, 20, "sizing")).prompt_ids) + 20 for i in range(3)]  # what each reserves
    engine._batch.kv_capacity_bytes = runner.bytes_for([max(rooms)])  # room for one request at a time
    assert runner.bytes_for([min(rooms)] * 2) > engine._batch.kv_capacity_bytes
    sinks = []
    for i in range(3):
        sink = Collector()
        engine.submit(engine.prepare(request(i, 20, f"budget-{i}")), sink)
        sinks.append(sink)
    widest = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            widest[0] = max(widest[0], len(engine._batch))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    engine.start()
    for sink in sinks:
        assert sink.wait(60)[-1].finish_reason is FinishReason.LENGTH
    stop.set()
    watcher.join()
    assert widest[0] == 1


def test_slot_forward_matches_the_models_own_forward(tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    slots = SlotForward(tiny_model, 4, CPU)
    rows = [tokenizer(p)["input_ids"] for p in PROMPTS[:4]]
    with torch.inference_mode():
        first = feed_prompts(slots, rows)
        nxt = [int(t) for t in first.argmax(-1)]
        second = feed_step(slots, nxt)
        for i, ids in enumerate(rows):
            reference = tiny_model(input_ids=torch.tensor([[*ids, nxt[i]]])).logits[0, -2:].float()
            assert torch.allclose(first[i], reference[0], atol=1e-4), f"prefill row {i}"
            assert torch.allclose(second[i], reference[1], atol=1e-4), f"decode row {i}"


def test_slot_moves_keep_each_rows_cache(tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    slots = SlotForward(tiny_model, 4, CPU)
    rows = [tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
    with torch.inference_mode():
        feed_prompts(slots, rows)
        slots.move(2, 0)  # row 0 leaves; row 2 takes its slot
        moved = feed_step(slots, [5, 6])
        reference = [tiny_model(input_ids=torch.tensor([rows[2] + [5]])).logits[0, -1],
                     tiny_model(input_ids=torch.tensor([rows[1] + [6]])).logits[0, -1]]
    assert torch.allclose(moved[0], reference[0], atol=1e-4)
    assert torch.allclose(moved[1], reference[1], atol=1e-4)


def test_other_architectures_use_the_per_slot_runner(tokenizer) -> None:  # type: ignore[no-untyped-def]
    from transformers import GPT2Config, GPT2LMHeadModel  # not a family of executor/families.py

    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=len(tokenizer), n_positions=256)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    runner = cpu_runner(model, 4)
    assert isinstance(runner, PerSlotExecutor)
    rows = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    with torch.inference_mode():
        for i, ids in enumerate(rows):
            runner.forward([Feed(i, ids, 1)])
        runner.move(1, 0)
        logits = runner.forward([Feed(0, [9], 1)])
        reference = model(input_ids=torch.tensor([rows[1] + [9]])).logits[0, -1]
    assert torch.allclose(logits[0], reference, atol=1e-4)


def test_a_failing_prefill_fails_its_batch_cleanly_and_the_engine_goes_on(make_engine, tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    runner = cpu_runner(tiny_loaded.model, 4)
    poisoned = list(tiny_loaded.tokenizer(PROMPTS[4])["input_ids"])

    class FaultyRunner:  # the real runner, with a fault injected for one prompt
        max_slots = runner.max_slots

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(runner, name)

        def forward(self, feeds: list[Feed]) -> torch.Tensor:
            if any(list(feed.tokens) == poisoned for feed in feeds):
                raise RuntimeError("injected prefill fault")
            return runner.forward(feeds)

    engine = make_engine(max_batch_size=4, start=False)
    engine._batch._executor_built = FaultyRunner()
    ok, bad = Collector(), Collector()
    engine.submit(engine.prepare(request(0, 6, "ok")), ok)
    engine.submit(engine.prepare(request(4, 6, "bad")), bad)
    engine.start()
    assert bad.wait(30)[-1].finish_reason is FinishReason.ERROR
    assert "injected prefill fault" in (bad.final.error or "")
    ok.wait(30)
    assert engine.active_count() == 0
    assert run_alone(engine, request(1, 4, "after")) != []  # the engine still serves


def test_slot_forward_runs_in_bfloat16_on_cpu(tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    import copy

    model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    slots = SlotForward(model, 2, CPU)
    ids = tokenizer(PROMPTS[0])["input_ids"]
    with torch.inference_mode():
        first = feed_prompt(slots, 0, ids)
        second = feed_step(slots, [int(first.argmax())])
        reference = model(input_ids=torch.tensor([[*ids, int(first.argmax())]])).logits[0, -2:].float()
    assert first.dtype == torch.float32
    assert torch.allclose(first[0], reference[0], atol=0.1, rtol=0.05)
    assert torch.allclose(second[0], reference[1], atol=0.1, rtol=0.05)
