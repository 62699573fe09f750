"""Load benchmark: concurrent gRPC streams against a real server, with ``model.generate()`` as baseline.

Starts ``proctor serve`` in a subprocess (real default model, audit on in a temporary database),
then for each concurrency N runs a closed loop of N asyncio streams (each sends its next request
when the previous one ends) over a fixed set of prompts of mixed lengths, a fixed number of
requests per level, bounded in time. Streams start spread over ``--ramp-s`` seconds, the way a
fleet of callers arrives, instead of all in the same millisecond. Each level runs without and
with a JSON-schema constraint on every request, the two alternating, ``--rounds`` times. Reports
per level: aggregate output tokens/s (median over rounds), time to first token p50/p99 and time
per output token p50/p99 (over all rounds' requests), errors, and the server's peak resident memory.

The baseline is ``model.generate()`` (greedy, batch 1, same prompts and new-token count, same
dtype as the server) run in this process while the server is idle, in the same run.

    python bench/load.py [--concurrency 1,4,16,32] [--rounds 2] [--new-tokens 128] [--time-limit-s 240]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

from prompts import PROMPTS  # noqa: E402

from proctor_client import AsyncProctorClient, ProctorClient, ProctorError  # noqa: E402

CLAUSE = ("The Receiving Party shall hold the Confidential Information in strict confidence, shall not disclose "
          "it to any third party without the prior written consent of the Disclosing Party, and shall use it "
          "solely for the Purpose. ")
# Mixed lengths: the four short shared prompts (15-20 tokens) plus two longer ones (about 50 and 95 tokens).
LOAD_PROMPTS = [*PROMPTS, "Summarise this clause in one sentence: " + CLAUSE,
                "List the obligations in this agreement: " + CLAUSE * 2]
# Long enough that constrained requests also run to --new-tokens: both modes then produce the same
# number of tokens per request and the ratio compares the cost of a step, not output lengths.
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "summary": {"type": "string", "minLength": 600, "maxLength": 900},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 6},
    },
    "required": ["title", "summary", "keywords"],
    "additionalProperties": False,
}


@dataclass
class Level:
    concurrency: int
    mode: str
    tokens: int = 0
    wall_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    completed: int = 0
    peak_rss_mb: float = 0.0
    round_rates: list[float] = field(default_factory=list)  # tokens/s of each round

    @property
    def tokens_per_s(self) -> float:
        """Median over rounds (each round: its tokens / its wall time)."""
        return statistics.median(self.round_rates) if self.round_rates else 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class RssSampler:
    """Peak resident memory of the server process while a level runs (sampled every 50 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_kb, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.peak_kb = max(self.peak_kb, int(line.split()[1]))
            except OSError:
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def closed_loop(concurrency: int, requests: int, ramp_s: float, time_limit_s: float,
                      send: Callable[[int], Awaitable[None]], errors: list[str]) -> float:
    """Send requests 0..requests-1 over ``concurrency`` closed-loop streams; return the wall time in seconds.

    Each stream awaits ``send(index)`` for its next index when the previous request ends; streams start
    spread over ``ramp_s``; past ``time_limit_s`` the remaining requests are not sent but counted in ``errors``.
    Shared with bench/peer.py, so both servers there are driven exactly as here.
    """
    counter = iter(range(requests))
    deadline = time.perf_counter() + time_limit_s

    async def worker(number: int) -> None:
        await asyncio.sleep(ramp_s * number / concurrency)
        for index in counter:
            if time.perf_counter() > deadline:
                errors.append("time limit reached before the request was sent")
                continue
            await send(index)

    begin = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    return time.perf_counter() - begin


async def run_level(address: str, level: Level, requests: int, new_tokens: int, ramp_s: float,
                    time_limit_s: float) -> None:
    async def stream(client: AsyncProctorClient, index: int) -> None:
        kwargs: dict[str, object] = {"max_new_tokens": new_tokens, "temperature": 0}
        if level.mode == "json":
            kwargs["json_schema"] = SCHEMA
        else:  # run to the full length without an EOS mask (min_new_tokens would add one per step)
            kwargs["ignore_eos"] = True
        start = time.perf_counter()
        first = last = 0.0
        count = 0
        try:
            async for chunk in client.stream_generate(LOAD_PROMPTS[index % len(LOAD_PROMPTS)], **kwargs):
                if chunk.token_ids:
                    last = time.perf_counter()
                    first = first or last
                    count += len(chunk.token_ids)
        except ProctorError as exc:
            level.errors.append(f"{exc.code.name}: {exc}")
            return
        level.tokens += count
        level.completed += 1
        if count:
            level.ttft_s.append(first - start)
        if count > 1:
            level.tpot_s.append((last - first) / (count - 1))

    async with AsyncProctorClient(address, timeout_s=time_limit_s, retries=0) as client:
        level.wall_s += await closed_loop(level.concurrency, requests, ramp_s, time_limit_s,
                                          lambda index: stream(client, index), level.errors)


def baseline(model_info: object, new_tokens: int, repeats: int) -> tuple[float, float]:
    """Median tokens/s and time to first token of ``model.generate()`` (batch 1) on the load prompts."""
    import torch

    from proctor.config import Settings
    from proctor.models import load_model

    loaded = load_model(Settings.load({"dtype": str(model_info.dtype), "warmup": False}))  # type: ignore[attr-defined]
    rates, firsts = [], []
    with torch.inference_mode():
        for round_ in range(repeats + 1):
            for prompt in LOAD_PROMPTS:
                ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids
                start = time.perf_counter()
                loaded.model(input_ids=ids)  # prefill alone: time to the first token
                first = time.perf_counter() - start
                start = time.perf_counter()
                loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=False,
                                      pad_token_id=loaded.tokenizer.pad_token_id)
                if round_:  # the first round warms up
                    rates.append(new_tokens / (time.perf_counter() - start))
                    firsts.append(first)
    return statistics.median(rates), statistics.median(firsts)


def start_server(directory: Path, extra: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), str(ROOT / "clients/python/src")])}
    log = open(directory / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen(
        [sys.executable, "-m", "proctor.cli", "serve", "--port", str(port),
         "--audit-db", str(directory / "audit.db"), *extra], stdout=log, stderr=subprocess.STDOUT, env=env)
    return process, f"127.0.0.1:{port}"


def print_table(levels: list[Level], base_rate: float, base_ttft: float, command: str) -> None:
    single = {lv.mode: lv.tokens_per_s for lv in levels if lv.concurrency == 1}
    single_ttft = {lv.mode: pct(lv.ttft_s, 0.99) for lv in levels if lv.concurrency == 1}
    plain = {lv.concurrency: lv.tokens_per_s for lv in levels if lv.mode == "plain"}
    print(f"\n`{command}`\n")
    print(f"Baseline `model.generate()` (batch 1, same prompts): {base_rate:.1f} tok/s, "
          f"time to first token {base_ttft * 1000:.0f} ms\n")
    print("| mode | streams | requests | tok/s (median of rounds) | × generate() | × 1 stream | × plain "
          "| TTFT p50 / p99 ms | TTFT p99 × 1 stream | TPOT p50 / p99 ms | errors | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for lv in levels:
        vs_plain = f"{lv.tokens_per_s / plain[lv.concurrency]:.2f}" if lv.mode == "json" and plain.get(
            lv.concurrency) else "—"
        print(f"| {lv.mode} | {lv.concurrency} | {lv.completed} | {lv.tokens_per_s:.1f} | "
              f"{lv.tokens_per_s / base_rate:.2f} | {lv.tokens_per_s / single.get(lv.mode, float('nan')):.1f} | "
              f"{vs_plain} | {pct(lv.ttft_s, 0.5) * 1000:.0f} / {pct(lv.ttft_s, 0.99) * 1000:.0f} | "
              f"{pct(lv.ttft_s, 0.99) / single_ttft.get(lv.mode, float('nan')):.2f} | "
              f"{pct(lv.tpot_s, 0.5) * 1000:.0f} / {pct(lv.tpot_s, 0.99) * 1000:.0f} | {len(lv.errors)} | "
              f"{lv.peak_rss_mb:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--requests", type=int, default=0, help="requests per level (default: max(6, 2 x streams))")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--modes", default="plain,json")
    parser.add_argument("--ramp-s", type=float, default=2.0, help="streams start spread over this many seconds")
    parser.add_argument("--time-limit-s", type=float, default=240.0, help="per level")
    parser.add_argument("--rounds", type=int, default=2, help="repeat every level; figures are medians")
    parser.add_argument("--baseline-repeats", type=int, default=2)
    parser.add_argument("--server-arg", action="append", default=[], help="extra `proctor serve` argument")
    args = parser.parse_args()
    levels_n = [int(c) for c in args.concurrency.split(",")]
    directory = Path(tempfile.mkdtemp(prefix="proctor-load-"))
    process, address = start_server(directory, [a for arg in args.server_arg for a in arg.split()])
    levels: list[Level] = []
    try:
        with ProctorClient(address, timeout_s=600) as client:
            info = client.wait_ready(600)
        print(f"server ready: {info.model_id} {info.dtype} on {info.device}", file=sys.stderr, flush=True)
        modes = args.modes.split(",")
        levels = [Level(n, mode) for mode in modes for n in levels_n]
        for round_ in range(args.rounds):
            for n in levels_n:
                # Modes alternate within a level, in a different order each round, so machine noise
                # hits both alike; figures are medians over rounds.
                for mode in modes if round_ % 2 == 0 else modes[::-1]:
                    level = next(lv for lv in levels if lv.concurrency == n and lv.mode == mode)
                    tokens_before, wall_before = level.tokens, level.wall_s
                    with RssSampler(process.pid) as rss:
                        asyncio.run(run_level(address, level, args.requests or max(6, 2 * n), args.new_tokens,
                                              args.ramp_s if n > 1 else 0, args.time_limit_s))
                    level.peak_rss_mb = max(level.peak_rss_mb, rss.peak_kb / 1024)
                    level.round_rates.append((level.tokens - tokens_before) / (level.wall_s - wall_before))
                    print(f"round {round_ + 1}: {mode} x{n}: {level.round_rates[-1]:.1f} tok/s, "
                          f"{len(level.errors)} errors {level.errors[:2]}", file=sys.stderr, flush=True)
        base_rate, base_ttft = baseline(info, args.new_tokens, args.baseline_repeats)
        print(f"generate(): {base_rate:.1f} tok/s", file=sys.stderr, flush=True)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
    print_table(levels, base_rate, base_ttft, "python bench/load.py " + " ".join(sys.argv[1:]))
    (directory / "levels.json").write_text(json.dumps([lv.__dict__ for lv in levels]))


if __name__ == "__main__":
    main()
