"""Hostile or careless input against the real server: each answered quickly with a compact error, while a
normal 2-token request running beside it keeps its latency (issue 12: within 1.5× of its value alone).

The hostile client sends in a closed loop with a short pause between requests (``ATTACK_PAUSE_S``):
a careless client. An unpaced flood would take a whole core of the two whatever the server did with
it; that is what per-caller requests/s limits are for (tests/integration/test_security_real.py)."""

from __future__ import annotations

import statistics
import threading
import time

import grpc

from proctor_client import ProctorClient, build_request
from tests.helpers.hostile import ATTACK_PAUSE_S, CHANNEL_OPTIONS, TRAILER_BYTES, hostile_requests, send_raw

ANSWER_WITHIN_S = 2.0


def test_each_hostile_input_is_refused_quickly_and_compactly(server: object) -> None:
    channel = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)  # type: ignore[attr-defined]
    try:
        for name, raw in hostile_requests().items():
            code, trailer, elapsed = send_raw(channel, raw)
            assert code is grpc.StatusCode.INVALID_ARGUMENT, name
            assert trailer < TRAILER_BYTES, f"{name}: {trailer} bytes of trailer"
            assert elapsed < ANSWER_WITHIN_S, f"{name}: answered after {elapsed:.2f} s"
    finally:
        channel.close()


def _latencies(client: ProctorClient, n: int) -> list[float]:
    request = build_request("The capital of France is", max_new_tokens=2, ignore_eos=True)
    out = []
    for _ in range(n):
        start = time.perf_counter()
        client.generate(request)
        out.append(time.perf_counter() - start)
    return out


def test_a_normal_request_keeps_its_latency_while_hostile_ones_are_refused(server: object,
                                                                           client: ProctorClient) -> None:
    hostile = list(hostile_requests().values())
    _latencies(client, 3)  # warm
    alone = statistics.median(_latencies(client, 15))
    stop = threading.Event()
    refused = [0]

    def attack() -> None:
        channel = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)  # type: ignore[attr-defined]
        try:
            while not stop.is_set():
                for raw in hostile:
                    send_raw(channel, raw)
                    refused[0] += 1
                    stop.wait(ATTACK_PAUSE_S)
        finally:
            channel.close()

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    try:
        time.sleep(0.5)
        beside = statistics.median(_latencies(client, 15))
    finally:
        stop.set()
        attacker.join(60)
    print(f"2-token request: {alone * 1000:.0f} ms alone, {beside * 1000:.0f} ms beside {refused[0]} refusals")
    assert refused[0] >= len(hostile), "the hostile requests did not run beside the measurement"
    assert beside <= 1.5 * alone, f"2-token request: {beside * 1000:.0f} ms beside hostile input vs " \
                                  f"{alone * 1000:.0f} ms alone"
