"""Admission under bursts, deadlines, cancels and disconnects (issue 30), shared by the fast tests
(tests/integration/test_admission_real.py) and the full-size benchmark (bench/reliability.py --only interleavings).

- ``issue30_sequence``: the exact sequence that once left a server refusing all work (an overload burst,
  then calls that hit their deadline while their audit record was being committed).
- ``random_plan`` / ``run_plan``: a random interleaving of calls, each started at its own moment: calls
  that complete, calls whose deadline passes before admission, in the queue, in prefill or while
  decoding, calls the client cancels, and clients that disconnect mid-call; unary and streaming.
- ``admission_held``: the server's admission counters from a real metrics scrape; ``settled`` waits until
  they are all zero again, and ``served`` checks that an 8-token request is answered.
"""

from __future__ import annotations

import concurrent.futures as cf
import random
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from prometheus_client.parser import text_string_to_metric_families

from proctor_client.v1 import generation_pb2 as pb
from proctor_client.v1 import generation_pb2_grpc as pb_grpc

LONG_PROMPT, LONG_TOKENS = "Count: 1, 2, 3,", 512  # a call that cannot finish within a short deadline
KINDS = ("complete", "deadline_before", "deadline_queued", "deadline_running", "cancel", "disconnect")
# What each kind of call may end with, seen by its client (never INTERNAL, UNKNOWN, or a wait to the end).
ALLOWED = {
    "complete": {"OK", "RESOURCE_EXHAUSTED"},
    "deadline_before": {"DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"},
    "deadline_queued": {"DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "OK"},
    "deadline_running": {"DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"},
    "cancel": {"CANCELLED", "RESOURCE_EXHAUSTED", "OK"},
    "disconnect": {"CANCELLED", "UNAVAILABLE", "RESOURCE_EXHAUSTED", "OK"},
}


def request(prompt: str, tokens: int) -> pb.GenerateRequest:
    message = pb.GenerateRequest(prompt=prompt)
    message.stopping.max_new_tokens = tokens
    message.stopping.ignore_eos = True
    return message


@dataclass(frozen=True)
class Outcome:
    step: str
    code: str
    seconds: float


def _code(exc: grpc.RpcError) -> str:
    return exc.code().name  # type: ignore[attr-defined, no-any-return]


def call_once(channel: grpc.Channel, stream: bool, message: pb.GenerateRequest, timeout_s: float,
              metadata: Sequence[tuple[str, str]] = (), cancel_after_s: float | None = None,
              close_after_s: float | None = None, step: str = "") -> Outcome:
    """One Generate or StreamGenerate; optionally cancelled, or its channel closed, after a while."""
    stub = pb_grpc.GenerationStub(channel)
    start = time.monotonic()
    timer: threading.Timer | None = None
    try:
        if stream:
            call = stub.StreamGenerate(message, timeout=timeout_s, metadata=metadata)
        else:
            call = stub.Generate.future(message, timeout=timeout_s, metadata=metadata)
        if cancel_after_s is not None:
            timer = threading.Timer(cancel_after_s, call.cancel)
        elif close_after_s is not None:
            timer = threading.Timer(close_after_s, channel.close)
        if timer is not None:
            timer.start()
        if stream:
            for _ in call:
                pass
        else:
            call.result()
        code = "OK"
    except grpc.RpcError as exc:
        code = _code(exc)
    except (cf.CancelledError, grpc.FutureCancelledError):  # a unary future cancelled by its client
        code = "CANCELLED"
    finally:
        if timer is not None:
            timer.cancel()
    return Outcome(step, code, time.monotonic() - start)


def issue30_sequence(address: str) -> list[Outcome]:
    """Issue 30's reproduction, step by step (the server: 2 rows, 2 waiting places, 1 thread)."""
    outcomes: list[Outcome] = []
    with grpc.insecure_channel(address) as channel, cf.ThreadPoolExecutor(16) as pool:
        burst = [pool.submit(call_once, channel, True, request("Once upon a time", 64), 120, step="2 burst")
                 for _ in range(12)]
        time.sleep(0.05)  # the burst has arrived: the server is full
        outcomes += [call_once(channel, False, request("Hi", 1), 10, step="2 single while full") for _ in range(5)]
        outcomes += [future.result() for future in burst]
        outcomes.append(call_once(channel, False, request(LONG_PROMPT, LONG_TOKENS), 0.5, step="3 deadline"))
        outcomes.append(call_once(channel, False, request("Hi", 8), 60, step="4 after one deadline"))
        outcomes.append(call_once(channel, True, request(LONG_PROMPT, LONG_TOKENS), 0.5, step="5 stream deadline"))
        pair = [pool.submit(call_once, channel, False, request(LONG_PROMPT, LONG_TOKENS), 0.5, step="6 two deadlines")
                for _ in range(2)]
        outcomes += [future.result() for future in pair]
        outcomes.append(call_once(channel, False, request("Hi", 8), 60, step="7 after two deadlines"))
    return outcomes


@dataclass(frozen=True)
class PlannedCall:
    kind: str
    stream: bool
    start_s: float  # after the plan starts
    tokens: int
    timeout_s: float
    after_s: float  # cancel / disconnect after this long
    caller: int  # index into the plan's metadata list


def planned_call(kind: str, stream: bool, start_s: float, rng: random.Random, caller: int) -> PlannedCall:
    """A call of ``kind``: its size, deadline and (cancel, disconnect) moment drawn from ``rng``."""
    if kind == "complete":
        return PlannedCall(kind, stream, start_s, rng.choice((1, 4, 8, 16, 32)), 120, 0, caller)
    if kind == "deadline_before":  # gone before the server can admit it
        return PlannedCall(kind, stream, start_s, LONG_TOKENS, rng.choice((0.001, 0.003, 0.01)), 0, caller)
    if kind == "deadline_queued":  # likely waiting behind the running rows (or in its prefill) when it passes
        return PlannedCall(kind, stream, start_s, rng.choice((8, 32)), rng.uniform(0.02, 0.2), 0, caller)
    if kind == "deadline_running":
        return PlannedCall(kind, stream, start_s, LONG_TOKENS, rng.uniform(0.2, 0.8), 0, caller)
    return PlannedCall(kind, stream, start_s, LONG_TOKENS, 120, rng.uniform(0.0, 0.6), caller)


def random_plan(rng: random.Random, calls: int, callers: int = 1, span_s: float = 1.5) -> list[PlannedCall]:
    """``calls`` calls of random kinds, about a third of them in one burst at the start."""
    burst = calls // 3
    return [planned_call(rng.choice(KINDS), rng.random() < 0.5, 0.0 if index < burst else rng.uniform(0, span_s),
                         rng, rng.randrange(callers)) for index in range(calls)]


def run_plan(address: str, plan: Sequence[PlannedCall],
             metadata: Sequence[Sequence[tuple[str, str]]] = ((),)) -> list[tuple[PlannedCall, Outcome]]:
    """Run every planned call at its moment, each on its own channel (a client of its own)."""
    start = time.monotonic()

    def run(planned: PlannedCall) -> Outcome:
        time.sleep(max(0.0, start + planned.start_s - time.monotonic()))
        prompt = LONG_PROMPT if planned.tokens == LONG_TOKENS else "Once upon a time"
        channel = grpc.insecure_channel(address)
        try:
            return call_once(channel, planned.stream, request(prompt, planned.tokens), planned.timeout_s,
                             metadata[planned.caller],
                             cancel_after_s=planned.after_s if planned.kind == "cancel" else None,
                             close_after_s=planned.after_s if planned.kind == "disconnect" else None,
                             step=planned.kind)
        finally:
            channel.close()

    with cf.ThreadPoolExecutor(max(1, len(plan))) as pool:
        return list(zip(plan, pool.map(run, plan), strict=True))


def unexpected(results: Sequence[tuple[PlannedCall, Outcome]]) -> list[tuple[PlannedCall, Outcome]]:
    return [(planned, outcome) for planned, outcome in results if outcome.code not in ALLOWED[planned.kind]]


def codes(results: Sequence[tuple[PlannedCall, Outcome]]) -> Counter[str]:
    return Counter(f"{planned.kind}:{outcome.code}" for planned, outcome in results)


def admission_held(metrics_address: str) -> dict[str, float]:
    """The admission counters from the server's metrics endpoint: ``held:<holder>`` and ``caller:<name>``."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "proctor:admission_held":
                found[f"held:{sample.labels['holder']}"] = sample.value
            elif sample.name == "proctor:caller_generations_open":
                found[f"caller:{sample.labels['caller']}"] = sample.value
    return found


def settled(metrics_address: str, timeout_s: float = 15.0) -> dict[str, float]:
    """Poll until every admission counter is zero (returned), or return the last non-zero reading."""
    end = time.monotonic() + timeout_s
    while True:
        held = admission_held(metrics_address)
        if (held and not any(held.values())) or time.monotonic() > end:
            return held
        time.sleep(0.1)


def served(address: str, metadata: Sequence[tuple[str, str]] = (), timeout_s: float = 30.0) -> Outcome:
    """An 8-token request, as the proof that the server still takes work."""
    with grpc.insecure_channel(address) as channel:
        return call_once(channel, False, request("Hi", 8), timeout_s, metadata, step="8-token request")
