"""The OpenAI-compatible HTTP door measured: Proctor over HTTP against Proctor over gRPC, and llama-server, all
driven the same way (issue 28).

Bench-only (never CI or tests). One Proctor server (``proctor serve --http-port``, a subprocess, default
settings) serves both doors; per round and stream level the order of the doors alternates. The same chat
prompts (bench/load.py's), greedy, ``--new-tokens`` per request with EOS ignored (plain) or allowed (JSON,
bench/load.py's schema as a strict ``json_schema``), closed-loop streams (bench/load.py's ``closed_loop``):

- ``grpc``: the Python client's ``stream_generate`` with the chat messages;
- ``http``: the official ``openai`` client's streamed ``chat.completions`` (``extra_body={"ignore_eos": true}``);
- ``http-raw``: the same request read as raw server-sent events with httpx, so the door's own cost shows apart
  from the ``openai`` client's (its pydantic parse of every chunk runs on the same two cores as the server);
- ``http-json``: the same with ``response_format`` ``json_schema`` strict;
- ``--llama``: then, with Proctor stopped, llama-server (bench/llama_server.py's build, the default model's Q4_1
  GGUF, ``--parallel`` the largest stream level) through the very same ``openai`` client code, plain and JSON.

Figures: tokens/s (completion tokens over the closed loop's wall time; median over rounds), time to first token
p50, HTTP ÷ gRPC (target ≥ 0.95) as the ratio of the medians and as the median of each round's ratio (the doors
run back to back in a round, so the pair shares the machine's load of the moment), Proctor ÷ llama-server,
and JSON outputs that validate.

    python bench/openai_http.py [--streams 1,16] [--rounds 2] [--requests 2] [--min-requests 6] [--new-tokens 64]
                                [--llama] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src"), str(ROOT / "bench")]

import httpx  # noqa: E402
import jsonschema  # noqa: E402
import openai  # noqa: E402
from load import LOAD_PROMPTS, SCHEMA, closed_loop, start_server  # noqa: E402

from proctor_client import AsyncProctorClient  # noqa: E402

TIME_LIMIT_S = 1800.0


@dataclass
class Cell:
    """One door at one stream level: every round's tokens/s, and every request's time to first token."""

    rates: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    valid: int = 0
    checked: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _messages(index: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": LOAD_PROMPTS[index % len(LOAD_PROMPTS)]}]


def _check_json(cell: Cell, text: str) -> None:
    cell.checked += 1
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        cell.valid += 1
    except (ValueError, jsonschema.ValidationError):
        pass


Sender = Callable[[int], Awaitable[None]]
MakeSender = Callable[[Cell, list[int]], Sender]


def grpc_sender(client: AsyncProctorClient, new_tokens: int, cell: Cell, counted: list[int]) -> Sender:
    async def send(index: int) -> None:
        start, first = time.perf_counter(), 0.0
        async for chunk in client.stream_generate(messages=_messages(index), max_new_tokens=new_tokens,
                                                  temperature=0, ignore_eos=True):
            if chunk.token_ids:
                first = first or time.perf_counter()
                counted[0] += len(chunk.token_ids)
        if first:
            cell.ttft_s.append(first - start)
    return send


def openai_client(base_url: str) -> openai.AsyncOpenAI:
    """Retries only reconnect a dropped keep-alive connection (nothing was answered on it)."""
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="bench", max_retries=2, timeout=600)


def openai_sender(client: openai.AsyncOpenAI, model: str, new_tokens: int, cell: Cell, counted: list[int], *,
                  json_mode: bool) -> Sender:
    """The same client code for both servers: streamed chat completions, usage from the last chunk."""
    extra: dict[str, Any] = {}
    if json_mode:
        extra["response_format"] = {"type": "json_schema",
                                    "json_schema": {"name": "summary", "schema": SCHEMA, "strict": True}}
    else:
        extra["extra_body"] = {"ignore_eos": True}

    async def send(index: int) -> None:
        start, first, text, tokens = time.perf_counter(), 0.0, [], 0
        stream = await client.chat.completions.create(model=model, messages=_messages(index),  # type: ignore[arg-type]
                                                      max_tokens=new_tokens, temperature=0, stream=True,
                                                      stream_options={"include_usage": True}, **extra)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
                text.append(chunk.choices[0].delta.content)
                tokens += 1
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        counted[0] += tokens
        if first:
            cell.ttft_s.append(first - start)
        if json_mode:
            _check_json(cell, "".join(text))
    return send


def raw_sender(client: httpx.AsyncClient, base_url: str, model: str, new_tokens: int, cell: Cell,
               counted: list[int]) -> Sender:
    """The same request read as raw server-sent events with httpx: the door's cost without the SDK's parsing."""
    async def send(index: int) -> None:
        start, first, tokens = time.perf_counter(), 0.0, 0
        body = {"model": model, "messages": _messages(index), "max_tokens": new_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
        async with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith('data: {"id"'):
                    first = first or time.perf_counter()
                    if '"choices":[]' in line:  # the usage chunk
                        tokens = json.loads(line[6:])["usage"]["completion_tokens"]
        counted[0] += tokens
        if first:
            cell.ttft_s.append(first - start)
    return send


async def measure(make: MakeSender, cell: Cell, streams: int, requests: int) -> None:
    counted = [0]
    wall = await closed_loop(streams, requests, 0.0, TIME_LIMIT_S, make(cell, counted), cell.errors)
    cell.rates.append(counted[0] / wall)


async def rounds(doors: dict[str, MakeSender], cells: dict[str, dict[int, Cell]], levels: list[int],
                 args: argparse.Namespace, first_round: int = 0, rotate: bool = True) -> None:
    """Warm every door, then each round: every level, the doors back to back (each door first once per rotation)."""
    for make in doors.values():
        await measure(make, Cell(), 1, 1)
    names = list(doors)
    for round_ in range(first_round, first_round + (args.rounds if rotate else 1)):
        for streams in levels:
            order = names[round_ % len(names):] + names[:round_ % len(names)] if rotate else names
            for door in order:
                await measure(doors[door], cells[door][streams], streams,
                              max(streams * args.requests, args.min_requests))
                print(f"  round {round_ + 1} {door:<10} {streams:>2} streams: "
                      f"{cells[door][streams].rates[-1]:7.1f} tokens/s", flush=True)


def _wait_http(base_url: str, process: subprocess.Popen[bytes], path: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(base_url + path, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{base_url} not ready after {timeout_s:g} s")


def run_proctor(args: argparse.Namespace, levels: list[int], directory: Path) -> dict[str, dict[int, Cell]]:
    """One Proctor server; both doors measured in one event loop, each with one client kept warm throughout."""
    http_port = _free_port()
    process, address = start_server(directory, ["--http-port", str(http_port)])
    base = f"http://127.0.0.1:{http_port}"
    cells: dict[str, dict[int, Cell]] = {door: {n: Cell() for n in levels}
                                         for door in ("grpc", "http", "http-raw", "http-json")}

    async def measured(model: str) -> None:
        grpc_client, oa, raw = AsyncProctorClient(address, timeout_s=600), openai_client(base), httpx.AsyncClient(
            timeout=600)
        doors: dict[str, MakeSender] = {
            "grpc": lambda cell, counted: grpc_sender(grpc_client, args.new_tokens, cell, counted),
            "http": lambda cell, counted: openai_sender(oa, model, args.new_tokens, cell, counted, json_mode=False),
            "http-raw": lambda cell, counted: raw_sender(raw, base, model, args.new_tokens, cell, counted),
            "http-json": lambda cell, counted: openai_sender(oa, model, args.new_tokens, cell, counted,
                                                             json_mode=True)}
        try:
            await rounds(doors, cells, levels, args)
        finally:
            await grpc_client.close()
            await oa.close()
            await raw.aclose()

    try:
        _wait_http(base, process, "/ready")
        model = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=10).read())["data"][0]["id"]
        asyncio.run(measured(model))
    finally:
        process.terminate()
        process.wait(60)
    return cells


def run_llama(args: argparse.Namespace, levels: list[int]) -> dict[str, dict[int, Cell]]:
    """llama-server, started afresh each round (as bench/peer.py does), through the same openai client code."""
    from llama_server import CACHE, ensure_build, start_llama_server, stop
    from peer import default_gguf

    build = ensure_build()
    parallel = max(levels)
    cells: dict[str, dict[int, Cell]] = {door: {n: Cell() for n in levels} for door in ("llama", "llama-json")}

    async def measured(base: str, round_: int) -> None:
        oa = openai_client(base)
        doors: dict[str, MakeSender] = {
            door: lambda cell, counted, j=json_mode: openai_sender(oa, "default", args.new_tokens, cell, counted,
                                                                   json_mode=j)
            for door, json_mode in (("llama", False), ("llama-json", True))}
        try:
            await rounds(doors, cells, levels, args, first_round=round_, rotate=False)
        finally:
            await oa.close()

    for round_ in range(args.rounds):
        log = CACHE / f"openai_http-llama-round{round_ + 1}.log"
        process, base = start_llama_server(build.server, default_gguf(), threads=2, parallel=parallel,
                                           ctx=parallel * 1024, extra=[], log_path=log)
        try:
            _wait_http(base, process, "/health")
            asyncio.run(measured(base, round_))
        finally:
            stop(process)
    return cells


def _p50_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:6.0f}" if values else "     -"


def print_table(cells: dict[str, dict[int, Cell]], levels: list[int]) -> None:
    print("\n| door | streams | tokens/s | TTFT p50 ms | ÷ gRPC | ÷ gRPC, paired | ÷ llama-server | JSON valid |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for door, by_level in cells.items():
        for streams in levels:
            cell = by_level[streams]
            grpc_rate = cells["grpc"][streams].rate
            peer = {"http": "llama", "http-raw": "llama", "http-json": "llama-json"}.get(door)
            vs_llama = (f"{cell.rate / cells[peer][streams].rate:.2f}x" if peer in cells
                        and cells[peer][streams].rate else "-")
            valid = f"{cell.valid}/{cell.checked}" if cell.checked else "-"
            errors = f" ({len(cell.errors)} errors)" if cell.errors else ""
            grpc_rates = cells["grpc"][streams].rates
            paired = (f"{statistics.median(r / g for r, g in zip(cell.rates, grpc_rates, strict=False)):.3f}"
                      if door in ("http", "http-raw", "http-json") else "-")
            print(f"| {door}{errors} | {streams} | {cell.rate:.1f} | {_p50_ms(cell.ttft_s)} | "
                  f"{cell.rate / grpc_rate:.3f} | {paired} | {vs_llama} | {valid} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,16", help="closed-loop stream levels (default 1,16)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=2, help="requests per stream per round (default 2)")
    parser.add_argument("--min-requests", type=int, default=6,
                        help="at least this many requests per measurement (one stream's two are too short to time)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--llama", action="store_true", help="also llama-server through the same openai client")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    levels = [int(n) for n in args.streams.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        print(f"Proctor (gRPC and HTTP doors), streams {levels}, {args.rounds} rounds, {args.new_tokens} tokens")
        cells = run_proctor(args, levels, Path(tmp))
        if args.llama:
            print("llama-server through the same openai client")
            cells |= run_llama(args, levels)
    print_table(cells, levels)
    if args.json:
        Path(args.json).write_text(json.dumps({door: {n: vars(c) for n, c in by.items()}
                                               for door, by in cells.items()}, indent=1))


if __name__ == "__main__":
    main()
