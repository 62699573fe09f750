"""Hostile or careless input against the real server: each answered quickly with a compact error, while a
normal 2-token request running beside it keeps its latency (issue 12: within 1.5× of its value alone).

The hostile client sends in a closed loop with a short pause between requests (``ATTACK_PAUSE_S``):
a careless client. An unpaced flood would take a whole core of the two whatever the server did with
it; that is what per-caller requests/s limits are for (tests/integration/test_security_real.py)."""

from __future__ import annotations

import statistics

import grpc

from proctor_client import ProctorClient
from tests.helpers.hostile import (
    CHANNEL_OPTIONS,
    TRAILER_BYTES,
    hostile_requests,
    latency_beside_attack,
    normal_latency,
    send_raw,
)

ANSWER_WITHIN_S = 2.0
ROUNDS, SAMPLES = 3, 11


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


def test_a_normal_request_keeps_its_latency_while_hostile_ones_are_refused(server: object,
                                                                           client: ProctorClient) -> None:
    """Alone and beside the attack in alternating rounds; the median ratio is what must hold."""
    hostile = list(hostile_requests().values())
    normal_latency(client, 3)  # warm
    ratios, refused = [], 0
    for _ in range(ROUNDS):
        alone = normal_latency(client, SAMPLES)
        beside, count = latency_beside_attack(server.address, client, hostile, SAMPLES)  # type: ignore[attr-defined]
        ratios.append(beside / alone)
        refused += count
    print(f"2-token request beside hostile input / alone, per round: {', '.join(f'{r:.2f}' for r in ratios)}")
    assert refused >= ROUNDS * len(hostile), "the hostile requests did not run beside the measurement"
    assert statistics.median(ratios) <= 1.5, f"2-token request slowed {ratios} beside hostile input"
