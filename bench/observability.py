"""Observability overhead (issue 12): tokens/s with metrics and tracing on vs off, 1 and 16 streams.

Starts two ``proctor serve`` subprocesses on the real default model (audit on, compliance mode, each
in its own temporary database): **off** (the defaults: no metrics endpoint, no tracing; the
per-call log line is there in both) and **on** (``--metrics-port`` scraped by this process every
``--scrape-s`` seconds, ``--tracing`` exporting every span over OTLP/gRPC to a collector stub in
this process that counts what it receives). For each round and each concurrency N, a closed loop of
N asyncio streams runs ``--requests`` requests of ``--new-tokens`` tokens (greedy, ``ignore_eos``)
on one server, then on the other, the order alternating between rounds. Reports the median
tokens/s over rounds per mode, the ratio on/off (goal: at least 0.97), each round's figures, the
spans the collector received, and ``os.getloadavg()`` before and after (figures taken under load
are noise: retake them on a quiet machine).

    python bench/observability.py [--rounds 5] [--concurrency 1,16] [--requests 8,64] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

import grpc  # noqa: E402
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc  # noqa: E402
from prompts import PROMPTS  # noqa: E402

from proctor_client import AsyncProctorClient, ProctorClient  # noqa: E402

MODES = ("off", "on")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SpanSink(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace collector that only counts the spans it is sent."""

    def __init__(self) -> None:
        self.spans = 0
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        self.spans += sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class Scraper:
    """Scrapes a metrics endpoint every ``interval_s`` (what Prometheus would do, more often)."""

    def __init__(self, port: int, interval_s: float) -> None:
        self.url, self.interval_s, self.scrapes, self.bytes = f"http://127.0.0.1:{port}/metrics", interval_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as answer:
                    self.bytes = len(answer.read())
                    self.scrapes += 1
            except OSError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def start_server(mode: str, directory: Path, sink: SpanSink, metrics_port: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), str(ROOT / "clients/python/src")])}
    for key in [k for k in env if k.startswith("OTEL_")]:
        del env[key]
    extra: list[str] = []
    if mode == "on":
        extra = ["--metrics-port", str(metrics_port), "--tracing"]
        env.update({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.port}",
                    "OTEL_EXPORTER_OTLP_INSECURE": "true"})
    log = open(directory / f"server-{mode}.log", "wb")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen(
        [sys.executable, "-m", "proctor.cli", "serve", "--port", str(port),
         "--audit-db", str(directory / f"audit-{mode}.db"), *extra], stdout=log, stderr=subprocess.STDOUT, env=env)
    return process, f"127.0.0.1:{port}"


async def run_round(address: str, streams: int, requests: int, new_tokens: int) -> float:
    """Tokens/s of a closed loop of ``streams`` streams over ``requests`` requests."""
    counter = iter(range(requests))
    tokens = 0

    async def worker(client: AsyncProctorClient) -> None:
        nonlocal tokens
        for index in counter:
            async for chunk in client.stream_generate(PROMPTS[index % len(PROMPTS)], max_new_tokens=new_tokens,
                                                      temperature=0, ignore_eos=True):
                tokens += len(chunk.token_ids)

    async with AsyncProctorClient(address, timeout_s=600, retries=0) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(streams)))
        return tokens / (time.perf_counter() - start)


def per_call_costs(repeats: int = 2000) -> dict[str, float]:
    """Microseconds of CPU the observability adds, measured in this process (no server, no noise from
    the model): per engine step (the histogram observes) and per generating call on the event loop
    (metrics, the span tree of a constrained call, the JSON log line written to a file)."""
    import logging

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from proctor.audit.records import CallRecord
    from proctor.domain import FinishReason, GenerationRequest, TokenEvent
    from proctor.domain.events import Timings, Usage
    from proctor.observability.calls import CallObservation, Stage
    from proctor.observability.logs import ACCESS, JsonFormatter, log_call
    from proctor.observability.metrics import Metrics
    from proctor.observability.tracing import Tracing

    metrics = Metrics()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    tracing = Tracing(provider)
    handler = logging.FileHandler(os.devnull)
    handler.setFormatter(JsonFormatter())
    ACCESS.addHandler(handler)
    ACCESS.setLevel(logging.INFO)
    ACCESS.propagate = False
    now = time.time_ns()
    final = TokenEvent("r", (5,), "x", finish_reason=FinishReason.LENGTH, usage=Usage(20, 64),
                       timings=Timings(0.1, 40.0, 2600.0))
    costs: dict[str, float] = {}
    start = time.perf_counter()
    for _ in range(repeats):
        metrics.decode_step(0.04, 16)
        metrics.masks(0.001, ["", "forbidden"])
    costs["per step (decode + masks observe)"] = (time.perf_counter() - start) / repeats * 1e6
    start = time.perf_counter()
    for _ in range(repeats):
        observation = CallObservation("proctor.v1.Generation", "Generate", now, 0.0)
        observation.call = CallRecord("a" * 32, "Generate", 0, {"identity": "peer"}, {},
                                      request=GenerationRequest("r", prompt="p"), events=[final])
        observation.stages = [Stage(name, now, now + 1000, {}) for name in ("validate", "prepare",
                                                                           "constraint.compile", "audit.commit")]
        span = tracing.start(observation, (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),))
        metrics.record_call(observation, "OK", 2.7)
        tracing.finish(span, observation, "OK", now + 3_000_000_000)
        log_call(observation, "OK", 2.7, "ipv4:127.0.0.1:1")
    costs["per call (metrics + 8 spans + JSON log line)"] = (time.perf_counter() - start) / repeats * 1e6
    provider.shutdown()
    ACCESS.removeHandler(handler)
    return costs


def wait_ready(address: str, timeout_s: float = 300) -> None:
    with ProctorClient(address, timeout_s=timeout_s, retries=0) as client:
        client.wait_ready(timeout_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--requests", default="8,64", help="requests per round, one per concurrency level")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--scrape-s", type=float, default=1.0)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    counts = [int(r) for r in args.requests.split(",")]
    assert len(levels) == len(counts), "--requests needs one count per --concurrency level"
    load_before = os.getloadavg()
    costs = per_call_costs()
    sink = SpanSink()
    rates: dict[tuple[str, int], list[float]] = {(m, n): [] for m in MODES for n in levels}
    with tempfile.TemporaryDirectory(prefix="proctor-bench-obs-") as tmp:
        metrics_port = free_port()
        servers = {mode: start_server(mode, Path(tmp), sink, metrics_port) for mode in MODES}
        scraper = None
        try:
            for _, address in servers.values():
                wait_ready(address)
            scraper = Scraper(metrics_port, args.scrape_s)
            for _, address in servers.values():  # warm-up, not timed
                asyncio.run(run_round(address, max(levels), max(levels), 8))
            for round_ in range(args.rounds):
                for streams, requests in zip(levels, counts, strict=True):
                    order = MODES if round_ % 2 == 0 else MODES[::-1]
                    for mode in order:
                        rate = asyncio.run(run_round(servers[mode][1], streams, requests, args.new_tokens))
                        rates[(mode, streams)].append(rate)
                        print(f"round {round_ + 1} streams {streams:>2} {mode:>3}: {rate:7.1f} tok/s", flush=True)
        finally:
            if scraper is not None:
                scraper.stop()
            for process, _ in servers.values():
                process.terminate()
            for process, _ in servers.values():
                process.wait(60)
    load_after = os.getloadavg()
    command = "python bench/observability.py " + " ".join(sys.argv[1:])
    print(f"\n`{command.strip()}`\n")
    print(f"load average before {tuple(round(x, 2) for x in load_before)}, after "
          f"{tuple(round(x, 2) for x in load_after)} (cpus: {os.cpu_count()}); spans received by the collector: "
          f"{sink.spans}; metrics scrapes: {scraper.scrapes if scraper else 0} "
          f"({scraper.bytes if scraper else 0} bytes each)\n")
    print("| streams | requests × tokens | off tok/s (median) | on tok/s (median) | on / off "
          "| rounds off | rounds on |")
    print("|---|---|---|---|---|---|---|")
    for streams, requests in zip(levels, counts, strict=True):
        off, on = statistics.median(rates[("off", streams)]), statistics.median(rates[("on", streams)])
        print(f"| {streams} | {requests} × {args.new_tokens} | {off:.1f} | {on:.1f} | {on / off:.3f} | "
              f"{', '.join(f'{r:.1f}' for r in rates[('off', streams)])} | "
              f"{', '.join(f'{r:.1f}' for r in rates[('on', streams)])} |")
    print()
    for name, micros in costs.items():
        print(f"- {name}: {micros:.1f} µs of CPU (in-process, same machine)")
    sink.server.stop(0)


if __name__ == "__main__":
    main()
