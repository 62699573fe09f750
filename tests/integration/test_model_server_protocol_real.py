"""The inference gateway's model-server protocol on a real server (issue 58): the real default model, requests on
its OpenAI-compatible HTTP door as the gateway sends them, and its metrics endpoint scraped over HTTP and read as
the endpoint picker reads it, through the picker configuration the inference-gateway overlay ships
(tests/helpers/epp.py, written from llm-d-router's extractor).

What must hold: an idle pod reads as empty with its prefix cache's shape; under load the queue, running and KV
gauges move (two rows run and one waits at a batch of two; the KV fraction grows as they generate and is
used / total), and all return to 0; the cache info's block count is what the prefix cache holds, measured by what
one prompt's chunks take.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.epp import Endpoint, engine_config, picker_config, plugin, read_endpoint
from prometheus_client.parser import text_string_to_metric_families

from proctor.config import Settings

BATCH = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[Any]:
    from proctor.app import BackgroundServer

    settings = Settings.load({"port": 0, "host": "127.0.0.1", "http_port": _free_port(),
                              "metrics_port": _free_port(), "max_batch_size": BATCH})
    background = BackgroundServer(settings).start(timeout_s=300)  # warm-up on, as deployed: the executor is built
    yield background
    background.stop()


@pytest.fixture(scope="module")
def engine() -> dict[str, Any]:
    """The picker's metric mapping for Proctor's pods, from the shipped configuration."""
    config = picker_config()
    return engine_config(config, plugin(config, "core-metrics-extractor")["defaultEngine"])


def scrape(server: Any) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.settings.metrics_port}/metrics", timeout=10) as response:
        assert response.status == 200
        return str(response.read().decode())


def sample(text: str, name: str) -> float:
    found = [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
    assert len(found) == 1, name
    return float(found[0])


def read_until(server: Any, engine: dict[str, Any], done: Callable[[Endpoint], bool],
               timeout_s: float = 120) -> tuple[Endpoint, str]:
    """Scrape until the picker's reading satisfies ``done``; that reading and the scrape it came from."""
    end = time.monotonic() + timeout_s
    while True:
        text = scrape(server)
        endpoint = read_endpoint(text, engine)
        if done(endpoint):
            return endpoint, text
        assert time.monotonic() < end, f"the gauges never read as wanted: last {endpoint}"
        time.sleep(0.02)


def post(server: Any, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{server.settings.http_port}{path}",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=300)


def model_id(server: Any) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.settings.http_port}/v1/models", timeout=10) as response:
        return str(json.load(response)["data"][0]["id"])


class Stream(threading.Thread):
    """One streamed completion, read chunk by chunk; ``chunks`` counts the token chunks received so far."""

    def __init__(self, server: Any, prompt: str, tokens: int) -> None:
        super().__init__(daemon=True)
        self.body = {"model": model_id(server), "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                     "ignore_eos": True, "stream": True}
        self.server, self.chunks, self.error = server, 0, ""

    def run(self) -> None:
        try:
            with post(self.server, "/v1/completions", self.body) as response:
                for line in response:
                    if line.startswith(b"data: {"):
                        self.chunks += 1
        except Exception as exc:  # reported by the test, not lost in the thread
            self.error = repr(exc)


def test_an_idle_pod_reads_as_empty_with_its_prefix_cache_shape(server: Any, engine: dict[str, Any]) -> None:
    endpoint = read_endpoint(scrape(server), engine)
    assert (endpoint.waiting, endpoint.running, endpoint.kv_usage) == (0, 0, 0.0)
    assert endpoint.block_size == server.settings.prefill_chunk_tokens and endpoint.num_blocks > 0


def test_the_gauges_move_under_load_from_the_http_door(server: Any, engine: dict[str, Any]) -> None:
    streams = [Stream(server, f"Story {i}: once upon a time", 160) for i in range(BATCH + 1)]
    for stream in streams:
        stream.start()
    # Two rows run and one waits; the rows hold cache once their prompts are fed (a row that has just joined
    # holds nothing yet).
    busy, text = read_until(server, engine, lambda e: (e.running, e.waiting) == (BATCH, 1) and e.kv_usage > 0)
    used, total = sample(text, "proctor:kv_cache_used_bytes"), sample(text, "proctor:kv_cache_total_bytes")
    assert 0 < used < total and busy.kv_usage == pytest.approx(used / total)
    end = time.monotonic() + 120
    while sum(1 for s in streams if s.chunks) < BATCH:  # the running rows' first tokens
        assert time.monotonic() < end and all(not s.error for s in streams), [s.error for s in streams]
        time.sleep(0.02)
    running = [s for s in streams if s.chunks]
    marks = [s.chunks for s in running]
    while not all(s.chunks >= mark + 20 for s, mark in zip(running, marks, strict=True)):
        assert time.monotonic() < end and all(not s.error for s in streams), [s.error for s in streams]
        time.sleep(0.02)
    later = read_endpoint(scrape(server), engine)
    assert later.kv_usage > busy.kv_usage  # twenty more tokens a row held in the cache
    for stream in streams:
        stream.join(timeout=300)
    assert all(not s.error and s.chunks for s in streams), [(s.error, s.chunks) for s in streams]
    idle, _ = read_until(server, engine, lambda e: e.running == 0, timeout_s=10)
    assert (idle.waiting, idle.kv_usage) == (0, 0.0)


def test_the_block_count_is_what_the_prefix_cache_holds(server: Any, engine: dict[str, Any]) -> None:
    before = scrape(server)
    prompt = " ".join(secrets.token_hex(3) for _ in range(200))  # new chunks only: nothing of it is cached yet
    with post(server, "/v1/completions", {"model": model_id(server), "prompt": prompt, "max_tokens": 1}) as response:
        prompt_tokens = json.load(response)["usage"]["prompt_tokens"]
    after = scrape(server)
    endpoint = read_endpoint(after, engine)
    chunks = prompt_tokens // endpoint.block_size
    grown = sample(after, "proctor:prefix_cache_bytes") - sample(before, "proctor:prefix_cache_bytes")
    assert chunks >= 2 and grown > 0 and grown % chunks == 0
    assert endpoint.num_blocks == server.settings.prefix_cache_mb * 1024 * 1024 // (grown // chunks)
