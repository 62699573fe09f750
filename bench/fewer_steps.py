"""Fewer steps for the same tokens (issue 27): the prefix cache, jump-forward and prompt-lookup speculation.

In one process on the real default model, each configuration on its own engine over the same loaded
weights, in the same run (ratios are same-run ratios):

- ``today``: every feature off (``--no-jump-forward --speculation off --prefix-cache-mb 0``), the stepwise path;
- ``jump``: the prefix cache and jump-forward, no speculation;
- ``default``: the server's defaults (cache, jump-forward, speculation auto: on while at most
  ``speculation_max_rows`` rows run);
- ``spec``: speculation on whatever the batch (``--speculation on``).

Parts (``--parts``):

- **prefix**: a ~1,500-token system prompt (new each round, so the first request is cold) and 20-token
  questions. Time to first token of the first request and of three later ones (different questions), medians
  over rounds, with the cache and without. ``--llama`` adds llama-server with ``cache_prompt: true`` on the same
  raw text (bench/llama_server.py's build).
- **json**: bench/load.py's prompts and JSON schema (the peer bench's), greedy, closed-loop streams; plain
  requests of the same prompts run exactly as many tokens as the JSON one did (EOS ignored), so JSON ÷ plain
  compares steps, not lengths. tokens/s (median over rounds), decode steps per output token, acceptance.
- **contracts**: ``--drafts`` varied drafts per template (bench/contracts.py's), each as DraftContract's first
  attempt (the specialised schema, the rendered messages, the template's token budget and repetition
  stop), greedy, at 1 stream and at 16. Latency p50, tokens/s, steps per token, acceptance, and how many
  outputs are token-identical to ``today``'s.

    python bench/fewer_steps.py [--parts prefix,json,contracts] [--rounds 2] [--drafts 20] [--llama] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src"), str(ROOT / "bench")]

from contracts import varied_requests  # noqa: E402
from load import LOAD_PROMPTS, SCHEMA  # noqa: E402

from proctor.config import Settings  # noqa: E402
from proctor.constraints.compiler import CompileLimits, ConstraintCompiler  # noqa: E402
from proctor.constraints.registry import SchemaRegistry  # noqa: E402
from proctor.constraints.service import ConstraintService  # noqa: E402
from proctor.contracts.attempt_plans import render_messages  # noqa: E402
from proctor.contracts.specialise import specialise  # noqa: E402
from proctor.contracts.templates import TemplateRegistry  # noqa: E402
from proctor.domain import (  # noqa: E402
    ChatMessage,
    ConstraintRequest,
    GenerationRequest,
    RepetitionParams,
    StoppingParams,
    TokenEvent,
)
from proctor.engine.engine import Engine  # noqa: E402
from proctor.models import load_model  # noqa: E402

CONFIGS: dict[str, dict[str, Any]] = {
    "today": {"jump_forward": False, "speculation": "off", "prefix_cache_mb": 0},
    "jump": {"speculation": "off"},
    "default": {},
    "spec": {"speculation": "on"},
}
RULE = ("Rule {i}: the assistant answers in plain English, names the clause it relies on, never invents facts "
        "about the parties and says so when the contract is silent. ")
QUESTIONS = ["Which rule says what to do when the contract is silent about a term?",
             "May the assistant guess the name of a party when the contract leaves it out?",
             "What should an answer name when it relies on a particular clause of the agreement?",
             "Summarise the rules about facts concerning the parties in one short sentence."]


@dataclass
class Run:
    """One request's outcome, as the caller saw it."""

    tokens: list[int]
    ttft_s: float
    total_s: float
    usage: Any


def run_one(engine: Engine, request: GenerationRequest) -> Run:
    events: list[TokenEvent] = []
    done = threading.Event()
    first: list[float] = []

    def sink(event: TokenEvent) -> None:
        if event.token_ids and not first:
            first.append(time.perf_counter())
        events.append(event)
        if event.finished:
            done.set()

    start = time.perf_counter()
    engine.submit(engine.prepare(request), sink)
    done.wait(900)
    end = time.perf_counter()
    return Run([t for e in events for t in e.token_ids], (first[0] if first else end) - start, end - start,
               events[-1].usage)


def run_streams(engine: Engine, requests: list[GenerationRequest], streams: int) -> tuple[list[Run], float]:
    """``requests`` over ``streams`` closed-loop threads; the runs in request order and the wall time."""
    runs: list[Run | None] = [None] * len(requests)
    counter = iter(range(len(requests)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                index = next(counter, None)
            if index is None:
                return
            runs[index] = run_one(engine, requests[index])

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for r in runs if r is not None], time.perf_counter() - start


@dataclass
class Tally:
    rates: list[float] = field(default_factory=list)
    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    latencies: list[float] = field(default_factory=list)

    def add(self, runs: list[Run], wall_s: float) -> None:
        produced = sum(len(r.tokens) for r in runs)
        self.rates.append(produced / wall_s)
        self.tokens += produced
        for r in runs:
            # The prefill gives the first token; every other token came from a decode forward.
            self.steps += r.usage.decode_steps + 1
            self.drafted += r.usage.drafted_tokens
            self.accepted += r.usage.accepted_tokens
            self.latencies.append(r.total_s)

    def summary(self) -> str:
        acceptance = f"{self.accepted / self.drafted:.0%}" if self.drafted else "-"
        return (f"{statistics.median(self.rates):7.1f} tok/s | {self.steps / max(1, self.tokens):.2f} steps/token | "
                f"acceptance {acceptance} ({self.accepted}/{self.drafted})")


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def part_prefix(engines: dict[str, Engine], tokenizer: Any, rounds: int, llama: bool) -> dict[str, Any]:
    figures: dict[str, dict[str, list[float]]] = {}
    systems = []
    for number in range(rounds):
        system = f"Session {number} of the contract desk. " + "".join(RULE.format(i=i) for i in range(48))
        systems.append(system)
    print(f"prefix: system prompt {len(tokenizer(systems[0])['input_ids'])} tokens, questions "
          f"{[len(tokenizer(q)['input_ids']) for q in QUESTIONS]} tokens", flush=True)
    for name in ("today", "default"):
        engine = engines[name]
        first, later = [], []
        for number, system in enumerate(systems):
            for index, question in enumerate(QUESTIONS):
                request = GenerationRequest(
                    request_id=f"prefix-{name}-{number}-{index}",
                    messages=(ChatMessage("system", system), ChatMessage("user", question)),
                    stopping=StoppingParams(max_new_tokens=4), prefix_cache_scope="bench")
                run = run_one(engine, request)
                (first if index == 0 else later).append(run.ttft_s)
        figures[name] = {"first": first, "later": later}
        ratio = statistics.median(later) / statistics.median(first)
        print(f"  {name:8s} TTFT first {statistics.median(first) * 1000:6.0f} ms, later "
              f"{statistics.median(later) * 1000:6.0f} ms (ratio {ratio:.2f})", flush=True)
    if llama:
        figures["llama-server"] = asyncio.run(llama_prefix(tokenizer, systems))
        f = figures["llama-server"]
        print(f"  llama-server cache_prompt TTFT first {statistics.median(f['first']) * 1000:6.0f} ms, later "
              f"{statistics.median(f['later']) * 1000:6.0f} ms "
              f"(ratio {statistics.median(f['later']) / statistics.median(f['first']):.2f})", flush=True)
    return figures


async def llama_prefix(tokenizer: Any, systems: list[str]) -> dict[str, list[float]]:
    import tempfile

    from llama_server import ensure_build, start_llama_server, stop, stream_completion, wait_healthy

    from proctor.models.default_model import GGUF_NAME, default_model_store

    build = ensure_build()
    gguf = default_model_store() / "gguf" / GGUF_NAME
    with tempfile.TemporaryDirectory() as tmp:
        process, base = start_llama_server(build.server, gguf, threads=2, parallel=1, ctx=4096, extra=[],
                                           log_path=Path(tmp) / "llama.log")
        try:
            wait_healthy(base, process, 120)
            first, later = [], []
            for system in systems:
                for index, question in enumerate(QUESTIONS):
                    text = chat_prompt(tokenizer, [{"role": "system", "content": system},
                                                   {"role": "user", "content": question}])
                    start = time.perf_counter()
                    ttft = None
                    async for _ in stream_completion(base, {"prompt": text, "n_predict": 4, "temperature": 0,
                                                            "cache_prompt": True}):
                        ttft = ttft or time.perf_counter() - start
                    (first if index == 0 else later).append(ttft or time.perf_counter() - start)
            return {"first": first, "later": later}
        finally:
            stop(process)


def part_json(engines: dict[str, Engine], tokenizer: Any, rounds: int, streams: list[int]) -> dict[str, Any]:
    prompts = [chat_prompt(tokenizer, [{"role": "user", "content": p}]) for p in LOAD_PROMPTS]
    figures: dict[str, Any] = {}
    for level in streams:
        count = max(len(prompts), level)
        for name in ("today", "jump", "default", "spec"):
            json_tally, plain_tally = Tally(), Tally()
            engine = engines[name]
            for number in range(rounds):
                requests = [GenerationRequest(
                    request_id=f"json-{name}-{level}-{number}-{i}", prompt=prompts[i % len(prompts)],
                    stopping=StoppingParams(max_new_tokens=256),
                    constraint=ConstraintRequest("json_schema", text=json.dumps(SCHEMA))) for i in range(count)]
                runs, wall = run_streams(engine, requests, level)
                json_tally.add(runs, wall)
                plain = [GenerationRequest(request_id=f"plain-{name}-{level}-{number}-{i}",
                                           prompt=prompts[i % len(prompts)],
                                           stopping=StoppingParams(max_new_tokens=len(runs[i].tokens), ignore_eos=True))
                         for i in range(count)]
                plain_runs, plain_wall = run_streams(engine, plain, level)
                plain_tally.add(plain_runs, plain_wall)
            ratio = statistics.median(json_tally.rates) / statistics.median(plain_tally.rates)
            figures[f"{name}@{level}"] = {"json": json_tally.__dict__, "plain": plain_tally.__dict__, "ratio": ratio}
            print(f"json {level:2d} streams {name:8s} JSON {json_tally.summary()}", flush=True)
            print(f"json {level:2d} streams {name:8s} plain {plain_tally.summary()} | JSON ÷ plain {ratio:.2f}",
                  flush=True)
    return figures


def part_contracts(engines: dict[str, Engine], drafts: int, streams: list[int]) -> dict[str, Any]:
    registry = TemplateRegistry.load(SchemaRegistry.load())
    requests: list[GenerationRequest] = []
    rng = random.Random(27)
    for ref in ("contract/nda", "contract/service-agreement"):
        template = registry.resolve(ref)
        for contract in varied_requests(template, drafts, rng):
            specialised = specialise(template, contract)
            ngram, repeats = template.repetition
            requests.append(GenerationRequest(
                request_id=contract.request_id, messages=render_messages(template, contract, specialised),
                stopping=StoppingParams(max_new_tokens=template.max_new_tokens,
                                        repetition=RepetitionParams(ngram, repeats)),
                constraint=ConstraintRequest("json_schema", text=specialised.schema_json),
                prefix_cache_scope="bench"))
    figures: dict[str, Any] = {}
    reference: list[list[int]] = []
    for level in streams:
        for name in ("today", "jump", "default", "spec"):
            tally = Tally()
            runs, wall = run_streams(engines[name], requests, level)
            tally.add(runs, wall)
            if name == "today" and level == streams[0]:
                reference = [r.tokens for r in runs]
            same = sum(r.tokens == ref for r, ref in zip(runs, reference, strict=True))
            p50 = statistics.median(tally.latencies)
            figures[f"{name}@{level}"] = {**tally.__dict__, "identical": same, "p50_s": p50}
            print(f"contracts {level:2d} streams {name:8s} p50 {p50:5.2f} s | {tally.summary()} | identical to "
                  f"today {same}/{len(runs)}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="prefix,json,contracts")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--drafts", type=int, default=20, help="contract drafts per template")
    parser.add_argument("--streams", default="1,16")
    parser.add_argument("--llama", action="store_true", help="llama-server with cache_prompt on the prefix part")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    base = {"warmup": False}
    loaded = load_model(Settings.load(base, environ={}))
    compiler = ConstraintCompiler(
        tokenizer=loaded.tokenizer, model_path=str(loaded.tokenizer_source), vocab_size=loaded.vocab_size,
        eos_token_ids=tuple(loaded.eos_token_ids), tokenizer_fingerprint=loaded.tokenizer_sha256,
        limits=CompileLimits(30, 1 << 20), isolate=False, workers=1)
    constraints = ConstraintService(compiler, None)
    engines = {name: Engine(loaded, Settings.load({**base, **config}, environ={}), constraints=constraints)
               for name, config in CONFIGS.items()}
    for engine in engines.values():
        engine.start()
        engine.generate_blocking(GenerationRequest(request_id="warm", prompt="Hello", stopping=StoppingParams(
            max_new_tokens=4)))
    print(f"weights {loaded.weights}; configurations: {CONFIGS}", flush=True)
    figures: dict[str, Any] = {}
    parts = args.parts.split(",")
    if "prefix" in parts:
        figures["prefix"] = part_prefix(engines, loaded.tokenizer, max(3, args.rounds), args.llama)
    if "json" in parts:
        figures["json"] = part_json(engines, loaded.tokenizer, args.rounds, streams)
    if "contracts" in parts:
        figures["contracts"] = part_contracts(engines, args.drafts, streams)
    for engine in engines.values():
        engine.shutdown(1)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    main()
