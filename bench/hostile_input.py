"""Hostile input (issue 12): how fast each oversized or malformed request is refused, how big its error
is, and what it does to a normal 2-token request running beside it.

Starts the real server in this process (audit on, compliance mode, a temporary database). Per
hostile request: the median time to its INVALID_ARGUMENT over ``--repeats`` sends and its trailer
size. Then, in alternating rounds, the median latency of a 2-token greedy request alone and while
another thread sends the hostile requests in a closed loop; the ratio beside/alone is the figure
(goal: at most 1.5). Prints ``os.getloadavg()``: figures taken beside other work are noise.

    python bench/hostile_input.py [--repeats 5] [--rounds 3] [--samples 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

import grpc  # noqa: E402

from proctor.app import BackgroundServer  # noqa: E402
from proctor.config import Settings  # noqa: E402
from proctor_client import ProctorClient  # noqa: E402
from tests.helpers.hostile import (  # noqa: E402
    CHANNEL_OPTIONS,
    hostile_requests,
    latency_beside_attack,
    normal_latency,
    send_raw,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=15)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        server = BackgroundServer(Settings.load({"port": 0, "host": "127.0.0.1", "audit_db": f"{tmp}/audit.db"},
                                                environ={})).start()
        try:
            requests = hostile_requests()
            print("| hostile request | size | status | trailer bytes | refused in (median) |\n|---|---|---|---|---|")
            with grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS) as channel:
                for name, raw in requests.items():
                    results = [send_raw(channel, raw) for _ in range(args.repeats)]
                    elapsed = statistics.median(r[2] for r in results)
                    print(f"| {name} | {len(raw) / 1e6:.2f} MB | {results[0][0].name} | {results[0][1]} | "
                          f"{elapsed * 1000:.0f} ms |")
            with ProctorClient(server.address, timeout_s=120) as client:
                normal_latency(client, 3)
                rows = []
                for _ in range(args.rounds):
                    alone = normal_latency(client, args.samples)
                    beside, refused = latency_beside_attack(server.address, client, list(requests.values()),
                                                            args.samples)
                    rows.append((alone, beside, refused))
            print("\n| round | 2-token request alone | beside hostile input | ratio | refusals meanwhile |\n"
                  "|---|---|---|---|---|")
            for index, (alone, beside, refused) in enumerate(rows, 1):
                print(f"| {index} | {alone * 1000:.0f} ms | {beside * 1000:.0f} ms | {beside / alone:.2f} "
                      f"| {refused} |")
            ratio = statistics.median(b / a for a, b, _ in rows)
            print(f"\nmedian ratio beside/alone: {ratio:.2f} (goal <= 1.5)")
        finally:
            server.stop()
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
