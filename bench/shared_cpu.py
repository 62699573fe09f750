"""Shared-CPU benchmark (issue 12): tokens/s beside busy neighbour processes, against a quiet machine.

For each thread policy it starts ``proctor serve`` in a subprocess (real default model, audit on in a
temporary database; a subprocess so each policy gets its own environment, which OpenMP reads when
torch loads), then measures greedy requests (``--new-tokens`` each, EOS ignored) with 0, 1 and 2
busy processes beside it, and quiet again at the end; the quiet figure is the median over both
quiet passes. The servers run side by side (idle ones cost nothing) and take turns round by round,
so load that other work puts on the machine hits every policy alike. A neighbour is a pure-Python
busy loop in its own process (``multiprocessing``), started and stopped by this script; measuring
starts ``--settle-s`` after the neighbours start, after one untimed round per policy (which is
also when an adaptive policy adapts).

Per level and stream count: ``--rounds`` rounds of N concurrent requests; tokens/s of a round is
N × tokens / its wall time; the figure is the median over rounds. Printed: tokens/s and the
slow-down vs quiet (quiet / loaded) per policy, and a Markdown table for bench/README.md.

Policies: ``default`` (what ``proctor serve`` does now), ``fixed2`` (the old behaviour: ``--threads 2``
and libgomp's own wait policy), ``fixed1`` (``--threads 1``), ``passive2`` (``--threads 2`` with
``OMP_WAIT_POLICY=PASSIVE``), ``tuned-spin`` (the default tuner with libgomp's own wait policy).

    python bench/shared_cpu.py [--policies default,fixed2] [--streams 1,4] [--rounds 5] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

from prompts import PROMPTS  # noqa: E402

from proctor_client import ProctorClient  # noqa: E402

# libgomp reads these when torch loads; "unset" is its own default (spin ~300k iterations, then sleep).
OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
LIBGOMP_DEFAULT = {"GOMP_SPINCOUNT": "300000"}
POLICIES: dict[str, tuple[list[str], dict[str, str]]] = {
    "default": ([], {}),
    "fixed2": (["--threads", "2"], LIBGOMP_DEFAULT),
    "fixed1": (["--threads", "1"], LIBGOMP_DEFAULT),
    "passive2": (["--threads", "2"], {"OMP_WAIT_POLICY": "PASSIVE"}),
    "tuned-spin": ([], LIBGOMP_DEFAULT),
}
GOALS = {1: 1.6, 2: 3.0}  # issue 12: at most this many times slower than quiet


def busy(stop: Any) -> None:
    """A neighbour: pure-Python arithmetic until told to stop."""
    x = 0
    while not stop.is_set():
        for _ in range(200_000):
            x += 1


class Neighbours:
    def __init__(self, count: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._processes = [context.Process(target=busy, args=(self._stop,), daemon=True) for _ in range(count)]

    def __enter__(self) -> Neighbours:
        for process in self._processes:
            process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()


def start_server(directory: Path, args: list[str], env_extra: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "service"), str(ROOT / "clients/python/src")])
    directory.mkdir(parents=True, exist_ok=True)
    log = open(directory / "server.log", "ab")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen(
        [sys.executable, "-m", "proctor.cli", "serve", "--port", str(port), "--audit-db", str(directory / "audit.db"),
         *args], stdout=log, stderr=subprocess.STDOUT, env=env)
    return process, f"127.0.0.1:{port}"


def stop_server(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


def one_round(client: ProctorClient, pool: ThreadPoolExecutor, streams: int, new_tokens: int, first: int) -> float:
    """``streams`` concurrent greedy requests; their tokens / the round's wall time."""
    def request(i: int) -> int:
        response = client.generate(PROMPTS[(first + i) % len(PROMPTS)], max_new_tokens=new_tokens, temperature=0,
                                   ignore_eos=True)
        return len(response.token_ids)

    start = time.perf_counter()
    tokens = sum(pool.map(request, range(streams)))
    return tokens / (time.perf_counter() - start)


Rates = dict[tuple[int, int], list[float]]  # (neighbours, streams) -> tokens/s of each round


def measure(policies: list[str], directory: Path, args: argparse.Namespace) -> dict[str, Rates]:
    """Round rates per policy; quiet (0 neighbours) is measured first and last.

    All the policies' servers run at once (an idle one costs nothing) and take turns round by round,
    so noise from outside hits every policy alike."""
    streams = [int(s) for s in args.streams.split(",")]
    servers = {name: start_server(directory / name, *POLICIES[name]) for name in policies}
    rates: dict[str, Rates] = {name: {} for name in policies}
    clients: dict[str, ProctorClient] = {}
    try:
        for name, (_, address) in servers.items():
            clients[name] = ProctorClient(address, timeout_s=600, retries=0)
            clients[name].wait_ready(600)
        with ThreadPoolExecutor(max(streams)) as pool:
            for neighbours in (0, *args.neighbours, 0):
                with Neighbours(neighbours):
                    time.sleep(args.settle_s if neighbours else 0.5)
                    for n in streams:
                        for name in policies:  # untimed: warms up, and lets an adaptive policy adapt
                            one_round(clients[name], pool, n, args.new_tokens, 0)
                        for r in range(args.rounds):
                            for name in policies if r % 2 == 0 else policies[::-1]:
                                rate = one_round(clients[name], pool, n, args.new_tokens, r)
                                rates[name].setdefault((neighbours, n), []).append(rate)
                        for name in policies:
                            got = rates[name][(neighbours, n)][-args.rounds:]
                            print(f"{name}: {neighbours} neighbour(s), {n} stream(s): {statistics.median(got):.1f} "
                                  f"tok/s (rounds {', '.join(f'{g:.1f}' for g in got)}), "
                                  f"load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    finally:
        for client in clients.values():
            client.close()
        for process, _ in servers.values():
            stop_server(process)
    return rates


def print_table(results: dict[str, Rates], neighbours: list[int], command: str,
                load_start: tuple[float, float, float]) -> None:
    print(f"\n`{command}`\n")
    print(f"Load average at start: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}; "
          f"at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    head = ["policy", "streams", "quiet tok/s", *(f"{k} neighbour{'s' if k > 1 else ''} tok/s (× slower)"
                                                   for k in neighbours)]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, rates in results.items():
        for n in sorted({s for _, s in rates}):
            quiet = statistics.median(rates[(0, n)])
            cells = []
            for k in neighbours:
                loaded = statistics.median(rates[(k, n)])
                ratio = quiet / loaded
                goal = GOALS.get(k)
                mark = "" if goal is None else (" ✓" if ratio <= goal else " ✗")
                cells.append(f"{loaded:.1f} ({ratio:.2f}×{mark})")
            print("| " + " | ".join([name, str(n), f"{quiet:.1f}", *cells]) + " |")
    print("\nGoal (issue 12): one neighbour at most 1.6× slower than quiet, two at most 3×.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="default,fixed2", help=f"comma-separated, of {', '.join(POLICIES)}")
    parser.add_argument("--streams", default="1,4", help="concurrent requests per round")
    parser.add_argument("--neighbours", default="1,2", help="busy processes beside the server")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per level; figures are medians")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--settle-s", type=float, default=3.0, help="wait after starting neighbours")
    args = parser.parse_args()
    args.neighbours = [int(k) for k in args.neighbours.split(",") if k.strip()]
    load_start = os.getloadavg()
    print(f"load average at start: {load_start}", file=sys.stderr, flush=True)
    directory = Path(tempfile.mkdtemp(prefix="proctor-shared-cpu-"))
    results = measure(args.policies.split(","), directory, args)
    print_table(results, args.neighbours, "python bench/shared_cpu.py " + " ".join(sys.argv[1:]), load_start)


if __name__ == "__main__":
    main()
