"""The watchdog in a real server (issue 30): an engine step that does not return — here a logits processor
that blocks the engine thread for a few seconds — turns liveness NOT_SERVING with an ERROR naming the engine
after ``watchdog_s``, shows in the metrics scrape, and health comes back once the engine steps again."""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from typing import Any

import grpc
import pytest
from helpers.reliability import free_port, health

from proctor.config import Settings
from proctor.decoding.plugins import PluginRegistry
from proctor.decoding.plugins.registry import PluginSpec
from proctor_client.v1 import generation_pb2 as pb
from proctor_client.v1 import generation_pb2_grpc as pb_grpc
from tests.integration.conftest import installed_model_dir

pytestmark = pytest.mark.real_model
BLOCK_S, WATCHDOG_S = 4.0, 1.0


def stuck_metric(metrics_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as answer:
        return next(line for line in answer.read().decode().splitlines()
                    if line.startswith('proctor:watchdog_stuck{part="engine"}'))


def test_a_blocked_engine_step_turns_liveness_not_serving_until_it_moves(caplog: pytest.LogCaptureFixture) -> None:
    from proctor.app import BackgroundServer

    installed_model_dir()
    metrics_port = free_port()
    server = BackgroundServer(Settings.load({"port": 0, "host": "127.0.0.1", "watchdog_s": WATCHDOG_S,
                                             "metrics_port": metrics_port, "max_batch_size": 2}))
    server.start(timeout_s=300)
    try:
        engine: Any = server.running.engine  # type: ignore[union-attr]
        blocked = threading.Event()

        def block(view: Any, logits: Any) -> None:
            if not blocked.is_set():  # the first step only: the engine thread sleeps, as a wedged kernel would
                blocked.set()
                time.sleep(BLOCK_S)

        engine.plugins = PluginRegistry([*engine.plugins.specs(), PluginSpec(
            "block_once", "0.1", "logits_processor", lambda params, context: block)])
        message = pb.GenerateRequest(prompt="Hello")
        message.stopping.max_new_tokens = 2
        message.logits_processors.add(name="block_once")
        with grpc.insecure_channel(server.address) as channel, caplog.at_level(logging.ERROR, "proctor.watchdog"):
            answer = pb_grpc.GenerationStub(channel).Generate.future(message, timeout=60)
            assert blocked.wait(30)
            seen: list[str] = []
            end = time.monotonic() + BLOCK_S - 0.5
            while time.monotonic() < end and "NOT_SERVING" not in seen:
                seen.append(health(server.address))
                time.sleep(0.2)
            assert "NOT_SERVING" in seen, seen  # within the block, after watchdog_s
            assert stuck_metric(metrics_port).endswith(" 1.0")
            assert answer.result().finish_reason == pb.FINISH_REASON_LENGTH  # the call itself still completes
        assert "the engine is stuck" in caplog.text
        end = time.monotonic() + 10
        while health(server.address) != "SERVING" and time.monotonic() < end:
            time.sleep(0.2)
        assert health(server.address) == "SERVING"  # moving again: health is back
        assert stuck_metric(metrics_port).endswith(" 0.0")
    finally:
        server.stop()
