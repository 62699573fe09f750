"""Hostile or careless requests (issue 12), serialized once: for the hostile-input test and benchmark."""

from __future__ import annotations

import json
import statistics
import threading
import time

import grpc

from proctor_client import ProctorClient, build_request

TRAILER_BYTES = 8 * 1024  # a default gRPC client reads 8 KiB of metadata
# Between two hostile requests of the closed loop: a careless client, not a flood (a flood is what
# per-caller requests/s limits are for; on two cores it would take a core whatever the server did).
ATTACK_PAUSE_S = 0.05
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 32 * 1024 * 1024)]


def schema_of_size(size: int) -> str:
    properties = {f"field_{i}": {"type": "string", "description": "x" * 40} for i in range(size // 80)}
    return json.dumps({"type": "object", "properties": properties})


def hostile_requests() -> dict[str, bytes]:
    """Serialized once, so the client side costs nothing while the server is measured."""
    with_enum = build_request("Hi", max_new_tokens=2)
    with_enum.json_whitespace = 99  # type: ignore[assignment]
    messages = {
        "3 MB JSON schema": build_request("Hi", max_new_tokens=2, json_schema=schema_of_size(3_000_000)),
        "100,000 allowed_token_ids": build_request("Hi", max_new_tokens=2, allowed_token_ids=list(range(100_000))),
        "100,000 logit_bias entries": build_request("Hi", max_new_tokens=2,
                                                    logit_bias={i: 1.0 for i in range(100_000)}),
        "900,000-character prompt": build_request("word " * 180_000, max_new_tokens=2),
        "unknown enum number": with_enum,
    }
    raw = {name: message.SerializeToString() for name, message in messages.items()}
    raw["undecodable bytes"] = b"\xff\xff\xff\xff\x0f"
    return raw


def send_raw(channel: grpc.Channel, raw: bytes) -> tuple[grpc.StatusCode, int, float]:
    """Send request bytes as they are; the status code, the trailer's size and the seconds to the answer."""
    call = channel.unary_unary("/proctor.v1.Generation/Generate")
    start = time.perf_counter()
    try:
        call(raw, timeout=30)
    except grpc.RpcError as error:
        trailer = sum(len(k) + len(v) for k, v in error.trailing_metadata() or ())
        return error.code(), trailer, time.perf_counter() - start
    return grpc.StatusCode.OK, 0, time.perf_counter() - start


def normal_latency(client: ProctorClient, samples: int) -> float:
    """Median seconds of a 2-token greedy request (the normal caller whose latency must hold)."""
    request = build_request("The capital of France is", max_new_tokens=2, ignore_eos=True)
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        client.generate(request)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def latency_beside_attack(address: str, client: ProctorClient, hostile: list[bytes], samples: int
                          ) -> tuple[float, int]:
    """``normal_latency`` while another thread sends the hostile requests in a paced closed loop; and
    how many were refused meanwhile."""
    stop, refused = threading.Event(), [0]

    def attack() -> None:
        with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            while not stop.is_set():
                for raw in hostile:
                    send_raw(channel, raw)
                    refused[0] += 1
                    stop.wait(ATTACK_PAUSE_S)

    thread = threading.Thread(target=attack, daemon=True)
    thread.start()
    time.sleep(0.3)
    try:
        return normal_latency(client, samples), refused[0]
    finally:
        stop.set()
        thread.join(60)
