"""The README's flow end to end: ``proctor serve`` as a process, ``proctor info`` / ``generate`` against it,
then SIGTERM: a clean exit with status 0, and a graceful drain of in-flight streams.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from helpers.reliability import health

from proctor_client import ProctorClient, ProctorError
from proctor_client.v1 import generation_pb2 as pb

pytestmark = pytest.mark.real_model

PROMPT = "The capital of France is"
DEFAULT_GRACE_S = 10.0  # Settings.grace_period_s
Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def served(serve_process: Callable[..., Any]) -> Iterator[Any]:
    """One ``proctor serve --port 0`` for the module's CLI tests (the last test stops it with SIGTERM)."""
    yield serve_process()


def _ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def _generate(cli: Cli, address: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return _ok(cli("generate", "--addr", address, "--prompt", PROMPT, "--max-new-tokens", "8",
                   "--temperature", "0", *extra))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_info_waits_until_ready(served: Any, cli: Cli) -> None:
    result = _ok(cli("info", "--addr", served.address, "--wait", "120"))
    assert "SmolLM2-135M-Instruct" in result.stdout
    assert "vocab_size" in result.stdout and "49152" in result.stdout
    assert served.wait_for_log(r"ready: serving", 1.0), served.log

    info = json.loads(_ok(cli("info", "--addr", served.address, "--output", "json")).stdout)
    assert info["model_id"] == "SmolLM2-135M-Instruct"
    assert info["context_length_tokens"] == 8192


def test_generate_prints_text(served: Any, cli: Cli) -> None:
    result = _generate(cli, served.address)
    assert result.stdout.endswith("\n")
    assert result.stdout.strip(), "no text printed"
    assert "finish=" in result.stderr  # the summary line goes to stderr, the text alone to stdout


def test_generate_json_output(served: Any, cli: Cli) -> None:
    text = _generate(cli, served.address).stdout
    data = json.loads(_generate(cli, served.address, "--output", "json").stdout)
    assert data["finish_reason"].startswith("FINISH_REASON_")
    assert data["finish_reason"] != "FINISH_REASON_UNSPECIFIED"
    assert isinstance(data["token_ids"], list) and data["token_ids"]
    assert all(isinstance(t, int) for t in data["token_ids"])
    assert len(data["token_ids"]) <= 8
    assert data["usage"]["completion_tokens"] == len(data["token_ids"])
    assert data["text"] + "\n" == text  # greedy: the same text as the plain call


def test_generate_stream_prints_the_same_text(served: Any, cli: Cli) -> None:
    unary = _generate(cli, served.address).stdout
    streamed = _generate(cli, served.address, "--stream")
    assert streamed.stdout == unary
    assert "finish=" in streamed.stderr

    lines = _generate(cli, served.address, "--stream", "--output", "json").stdout.splitlines()
    chunks = [json.loads(line) for line in lines if line.strip()]
    assert chunks
    assert "finish_reason" in chunks[-1]
    assert all("finish_reason" not in c for c in chunks[:-1])
    assert "".join(c.get("text", "") for c in chunks) + "\n" == unary


def test_info_without_server_fails(cli: Cli) -> None:
    address = f"127.0.0.1:{_free_port()}"
    started = time.monotonic()
    result = cli("info", "--addr", address, "--timeout", "5", timeout_s=60)
    assert result.returncode != 0
    assert "error" in result.stderr
    assert time.monotonic() - started < 30


def test_health_command_exits_zero_only_when_serving(served: Any, cli: Cli) -> None:
    result = _ok(cli("health", "--addr", served.address, timeout_s=60))
    assert "SERVING" in result.stdout
    unknown = cli("health", "--addr", served.address, "--service", "no.such.Service", timeout_s=60)
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr, unknown.stderr
    nobody = cli("health", "--addr", f"127.0.0.1:{_free_port()}", "--timeout", "1", timeout_s=60)
    assert nobody.returncode == 1 and "not serving" in nobody.stderr, nobody.stderr


def test_sigterm_exits_zero_and_logs_shutdown(served: Any) -> None:
    served.terminate()
    code = served.wait(DEFAULT_GRACE_S + 10)
    assert code == 0, f"exit status {code} after SIGTERM\n{served.log}"
    log = served.log
    assert "shutting down" in log
    assert "stopped" in log
    assert "Traceback" not in log


def test_sigterm_drains_a_running_stream(serve_process: Callable[..., Any]) -> None:
    server = serve_process("--grace-period", "60", "--drain-notice", "0")
    with ProctorClient(server.address, timeout_s=120) as client:
        client.wait_ready(120)
        chunks = client.stream_generate(PROMPT, temperature=0, max_new_tokens=24, ignore_eos=True)
        received = [next(chunks)]
        server.terminate()
        assert server.wait_for_log(r"shutting down", 10), f"no shutdown log after SIGTERM:\n{server.log}"
        time.sleep(0.3)

        with ProctorClient(server.address, timeout_s=10, retries=0) as late, pytest.raises(ProctorError) as refused:
            late.generate(PROMPT, temperature=0, max_new_tokens=2)
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE, str(refused.value)

        received.extend(chunks)  # the in-flight stream still completes normally

    assert received[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert all(not c.finish_reason for c in received[:-1])
    assert sum(len(c.token_ids) for c in received) == 24
    assert received[-1].usage.completion_tokens == 24
    code = server.wait(60 + 10)
    assert code == 0, f"exit status {code} after a graceful drain\n{server.log}"
    assert "stopped" in server.log


def test_sigterm_reports_not_serving_for_the_drain_notice_while_calls_are_still_served(
        serve_process: Callable[..., Any]) -> None:
    """A load balancer's probe sees NOT_SERVING (not a connection error) for the notice — on the main port
    and on the plaintext health-only port — and a call that still arrives is served; then the listener
    closes and the process exits 0."""
    notice_s = 3.0
    health_address = f"127.0.0.1:{_free_port()}"
    server = serve_process("--drain-notice", str(notice_s), "--health-port", health_address.rsplit(":", 1)[1])
    with ProctorClient(server.address, timeout_s=120, retries=0) as client:
        client.wait_ready(120)
        assert health(server.address) == health(health_address) == "SERVING"
        server.terminate()
        signalled = time.monotonic()
        seen: list[tuple[float, str, str]] = []
        served_late = None
        while server.proc.poll() is None and time.monotonic() - signalled < notice_s + 30:
            seen.append((time.monotonic() - signalled, health(server.address), health(health_address)))
            if served_late is None and seen[-1][1] == "NOT_SERVING":
                served_late = client.generate(PROMPT, temperature=0, max_new_tokens=4)
            time.sleep(0.1)
    assert server.wait(30) == 0, server.log
    for port in (1, 2):
        not_serving = [entry[0] for entry in seen if entry[port] == "NOT_SERVING"]
        assert not_serving and not_serving[0] < 1.0, seen  # at once
        assert not_serving[-1] - not_serving[0] >= notice_s - 0.5, seen  # for the whole notice
        assert all(entry[port] in ("SERVING", "NOT_SERVING") for entry in seen if entry[0] < not_serving[-1]), seen
        assert "SERVING" not in [entry[port] for entry in seen if entry[0] > not_serving[0]], seen  # never back
    assert served_late is not None and served_late.usage.completion_tokens == 4
    assert "draining: health NOT_SERVING for 3.0 s" in server.log
