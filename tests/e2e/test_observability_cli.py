"""``proctor serve --log-format json --metrics-port N`` as the README runs it (issue 12).

Every log line the server writes is one JSON object (library progress bars aside, which do not
go through logging); the call's line carries its request id, audit id, status and token counts;
the metrics endpoint answers over HTTP with the call counted; SIGTERM still exits 0.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proctor_client import ProctorClient

pytestmark = pytest.mark.real_model

TEXT_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_json_logs_and_metrics_endpoint(serve_process: Callable[..., Any]) -> None:
    metrics_port = _free_port()
    server = serve_process("--log-format", "json", "--metrics-port", str(metrics_port), "--no-warmup")
    assert server.wait_for_log(r"ready: serving", 240.0), server.log
    with ProctorClient(server.address, timeout_s=120.0, retries=0) as client:
        response = client.generate("The capital of France is", max_new_tokens=4, temperature=0, ignore_eos=True,
                                   request_id="e2e-json-log-1")
    assert server.wait_for_log(r'"request_id": "e2e-json-log-1"', 10.0), server.log

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(answer.read().decode()) for s in family.samples}
    ok = ("proctor:requests_total", (("code", "OK"), ("method", "Generate"), ("service", "proctor.v1.Generation")))
    assert samples[ok] == 1
    assert samples[("proctor:generation_tokens_total", ())] == response.usage.completion_tokens == 4

    server.terminate()
    assert server.wait(60.0) == 0, server.log
    server.kill()  # it has exited: this only waits for the last stderr lines to be read
    lines = server.lines
    assert not [line for line in lines if TEXT_LOG_LINE.match(line)], "text log lines in --log-format json"
    records = [json.loads(line) for line in lines if line.startswith("{")]
    messages = [r["message"] for r in records]
    assert any(m.startswith("listening on") for m in messages) and any(m.startswith("ready: serving") for m in messages)
    assert any(m.startswith("metrics on http://127.0.0.1:") for m in messages)
    call = next(r for r in records if r.get("request_id") == "e2e-json-log-1")
    assert call["logger"] == "proctor.access" and call["level"] == "INFO"
    assert call["rpc"] == "proctor.v1.Generation/Generate" and call["code"] == "OK"
    assert call["audit_id"] == response.audit_id
    assert call["completion_tokens"] == 4 and call["prompt_tokens"] == response.usage.prompt_tokens
    assert call["caller"] and call["duration_ms"] > 0
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records)
