"""Output work off the engine thread (issue 55, step 5): does moving detokenising, token details and events to a
thread of their own pay at 16 streams, with the same tokens?

In one process, on one engine (the real default model, or ``--model tiny``: the tests' random-weight model of two
layers, where a step is cheap and the output work weighs most), ``--streams`` concurrent requests of
``--new-tokens`` tokens each (EOS ignored; half greedy, half sampled with their own seeds; token details with five
alternatives, as the server computes them for its audit trail), their events relayed to an asyncio loop on another
thread as the server does (api/loop_relay.py). Two modes, alternating within each round (ABBA):

- ``engine``: today's path, the engine thread runs each token's output work (engine/output_processor.py) itself;
- ``worker``: the output work of every text-free request (``SequenceState.text_free``) goes to one worker thread,
  in order (the state's output processor is wrapped before the request is queued), and the engine thread goes on
  to its next step.

Prints each mode's tokens/s (median over rounds), the ratio worker ÷ engine, steps, the engine thread's CPU time
per token and, in ``engine`` mode, how much of it the output work took (CPU time, which other processes on a
shared machine do not inflate), and whether every request's tokens were identical in both modes.

    python bench/output_thread.py [--model default|tiny] [--streams 16] [--new-tokens 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src"), str(ROOT / "bench")]

from load import LOAD_PROMPTS  # noqa: E402

import proctor.engine.engine as engine_module  # noqa: E402
from proctor.api.loop_relay import LoopRelay  # noqa: E402
from proctor.config import Settings  # noqa: E402
from proctor.domain import GenerationRequest, SamplingParams, StoppingParams, TokenEvent  # noqa: E402
from proctor.engine.engine import Engine  # noqa: E402
from proctor.engine.output_processor import OutputProcessor  # noqa: E402
from proctor.engine.sequence import SequenceState  # noqa: E402

log = logging.getLogger("bench.output_thread")


class OutputWorker:
    """One thread that runs output jobs in the order they were submitted."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="proctor-output", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[..., None], *args: Any) -> None:
        self._jobs.put((job, args))

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, args = item
            try:
                job(*args)
            except Exception:
                log.exception("output work failed")


class Deferred:
    """A request's output processor whose token and closing work runs on the worker (everything else as is)."""

    def __init__(self, output: OutputProcessor, worker: OutputWorker) -> None:
        self._output = output
        self._worker = worker

    def follow(self, *args: Any) -> None:
        self._worker.submit(self._output.follow, *args)

    def close(self, *args: Any) -> None:
        self._worker.submit(self._output.close, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._output, name)


class BenchState(SequenceState):
    """The engine's request state, its output deferred to ``worker`` while one is set (text-free requests only)."""

    worker: OutputWorker | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if BenchState.worker is not None and self.text_free and self.request.sampling.num_beams == 1:
            self.output = Deferred(self.output, BenchState.worker)  # type: ignore[assignment]


class Timed:
    """The engine thread's CPU time in ``OutputProcessor.follow`` (the ``engine`` mode's output work): CPU time, not
    wall time, so that other processes on a shared machine do not inflate it."""

    seconds = 0.0
    calls = 0

    @classmethod
    def install(cls) -> None:
        follow = OutputProcessor.follow

        def timed(self: OutputProcessor, *args: Any) -> None:
            start = time.thread_time()
            follow(self, *args)
            if threading.current_thread().name == "proctor-engine":
                cls.seconds += time.thread_time() - start
                cls.calls += 1

        OutputProcessor.follow = timed  # type: ignore[method-assign]


def thread_cpu_s(thread: threading.Thread) -> float:
    """``thread``'s CPU time so far (Linux: its own clock)."""
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def load(model: str) -> Any:
    from proctor.models import load_model

    if model == "default":
        return load_model(Settings.load({"warmup": False}))
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from proctor.config import DEFAULT_MODEL_NAME, default_model_store
    from proctor.models import LoadedModel

    path = default_model_store() / DEFAULT_MODEL_NAME
    tokenizer = AutoTokenizer.from_pretrained(str(path), clean_up_tokenization_spaces=False, local_files_only=True)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=2048,
                         tie_word_embeddings=True, initializer_range=0.2, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    weights = LlamaForCausalLM(config).float().eval()
    weights.requires_grad_(False)
    return LoadedModel(model=weights, tokenizer=tokenizer, model_id="tiny", path=path, weights_sha256="tiny",
                       tokenizer_sha256="tiny", dtype=torch.float32, device=torch.device("cpu"),
                       eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, context_length=2048, vocab_size=len(tokenizer),
                       special_token_ids=frozenset(int(i) for i in tokenizer.all_special_ids))


def requests(tag: str, streams: int, new_tokens: int) -> list[GenerationRequest]:
    """The round's requests: every other one sampled with its own seed; token details as the audit asks them."""
    made = []
    for index in range(streams):
        sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=1000 + index) if index % 2 else SamplingParams()
        made.append(GenerationRequest(
            request_id=f"{tag}-{index}", prompt=LOAD_PROMPTS[index % len(LOAD_PROMPTS)], sampling=sampling,
            stopping=StoppingParams(max_new_tokens=new_tokens, ignore_eos=True), audited=True, audit_top_n=5))
    return made


def run_round(engine: Engine, relay: LoopRelay, batch: list[GenerationRequest]) -> tuple[float, list[list[int]], int]:
    """All of ``batch`` at once; (wall seconds until the last final event reached the loop, each request's tokens,
    engine steps)."""
    tokens: list[list[int]] = [[] for _ in batch]
    left = threading.Semaphore(0)

    def on_loop(index: int) -> Callable[[TokenEvent], None]:
        def deliver(event: TokenEvent) -> None:
            tokens[index].extend(event.token_ids)
            if event.finished:
                left.release()
        return deliver

    def sink_for(index: int) -> Callable[[TokenEvent], None]:
        deliver = on_loop(index)
        return lambda event: relay.send(deliver, event)

    prepared = [engine.prepare(request) for request in batch]
    steps = engine.steps
    start = time.perf_counter()
    for index, ready in enumerate(prepared):
        engine.submit(ready, sink_for(index))
    for _ in batch:
        left.acquire()
    return time.perf_counter() - start, tokens, engine.steps - steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("default", "tiny"), default="default")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    engine_module.SequenceState = BenchState  # type: ignore[misc]
    Timed.install()
    loaded = load(args.model)
    engine = Engine(loaded, Settings.load({"warmup": False, "max_batch_size": max(args.streams, 1)}))
    engine.start()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="bench-loop", daemon=True).start()
    relay, worker = LoopRelay(loop), OutputWorker()
    rates: dict[str, list[float]] = {"engine": [], "worker": []}
    steps: dict[str, list[int]] = {"engine": [], "worker": []}
    cpu: dict[str, list[float]] = {"engine": [], "worker": []}  # the engine thread's CPU seconds per token
    outputs: dict[str, list[list[list[int]]]] = {"engine": [], "worker": []}
    output_s = output_calls = 0.0
    for number in range(args.rounds + 1):  # round 0 warms both modes up and is not counted
        for mode in (("engine", "worker") if number % 2 else ("worker", "engine")):
            BenchState.worker = worker if mode == "worker" else None
            before_s, before_calls, before_cpu = Timed.seconds, Timed.calls, thread_cpu_s(engine._thread)
            wall, tokens, taken = run_round(engine, relay, requests(f"{mode}{number}", args.streams, args.new_tokens))
            produced = sum(len(t) for t in tokens)
            used = thread_cpu_s(engine._thread) - before_cpu
            print(f"  round {number} {mode:6s}: {produced / wall:7.1f} tok/s, {taken} steps, engine thread "
                  f"{used / produced * 1e6:.0f} µs CPU/token", file=sys.stderr, flush=True)
            if number:
                rates[mode].append(produced / wall)
                steps[mode].append(taken)
                cpu[mode].append(used / produced)
                outputs[mode].append(tokens)
                if mode == "engine":
                    output_s += Timed.seconds - before_s
                    output_calls += Timed.calls - before_calls
    BenchState.worker = None
    engine.shutdown(2)
    worker.stop()
    loop.call_soon_threadsafe(loop.stop)
    same = all(run == outputs["engine"][0] for mode in outputs for run in outputs[mode])
    before, after = statistics.median(rates["engine"]), statistics.median(rates["worker"])
    per_token_us = output_s / output_calls * 1e6 if output_calls else float("nan")
    print(f"\n{args.model} model, {args.streams} streams x {args.new_tokens} tokens, median of {args.rounds} rounds "
          f"(`python bench/output_thread.py --model {args.model}`):\n")
    print("| output work on | tok/s (median) | × engine | steps (median) | engine thread CPU µs/token "
          "| of which output work |")
    print("|---|---|---|---|---|---|")
    median_steps = {mode: statistics.median(taken) for mode, taken in steps.items()}
    engine_cpu = {mode: statistics.median(used) * 1e6 for mode, used in cpu.items()}
    print(f"| engine thread (today) | {before:.1f} | 1.00 | {median_steps['engine']} | {engine_cpu['engine']:.0f} "
          f"| {per_token_us:.0f} ({per_token_us / engine_cpu['engine']:.1%}) |")
    print(f"| worker thread | {after:.1f} | {after / before:.3f} | {median_steps['worker']} "
          f"| {engine_cpu['worker']:.0f} | — |")
    print(f"\ntokens identical in every round and mode: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
