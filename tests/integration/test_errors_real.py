"""Errors, cancellation, deadlines, health and reflection on the real server over real gRPC.

Every bad input is INVALID_ARGUMENT with a BadRequest field violation naming the protobuf field; a
cancelled stream or an expired deadline frees the engine at once; the standard health and reflection
services answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from proctor_client import ProctorClient, ProctorError, build_request
from proctor_client.v1 import generation_pb2 as pb

pytestmark = pytest.mark.real_model

PROMPT = "The capital of France is"
GENERATION_SERVICE = "proctor.v1.Generation"


def _empty_messages() -> pb.GenerateRequest:
    request = pb.GenerateRequest()
    request.messages.SetInParent()  # the oneof is "messages", with no turn in it
    assert request.WhichOneof("input") == "messages"
    return request


BAD_REQUESTS: list[tuple[str, Callable[[], pb.GenerateRequest], str]] = [
    ("empty-prompt", lambda: build_request(""), "prompt"),
    ("no-input", lambda: pb.GenerateRequest(), "prompt"),
    ("empty-messages", _empty_messages, "messages"),
    ("negative-temperature", lambda: build_request(PROMPT, temperature=-0.5), "sampling.temperature"),
    ("nan-temperature", lambda: build_request(PROMPT, temperature=float("nan")), "sampling.temperature"),
    ("top-p-zero", lambda: build_request(PROMPT, top_p=0.0), "sampling.top_p"),
    ("top-p-above-one", lambda: build_request(PROMPT, top_p=1.5), "sampling.top_p"),
    ("negative-top-k", lambda: build_request(PROMPT, top_k=-1), "sampling.top_k"),
    ("max-new-tokens-over-cap", lambda: build_request(PROMPT, max_new_tokens=10**6), "stopping.max_new_tokens"),
    ("max-new-tokens-zero", lambda: build_request(PROMPT, max_new_tokens=0), "stopping.max_new_tokens"),
    ("prompt-over-context", lambda: build_request("hello " * 9000, max_new_tokens=4), "prompt"),
    ("unknown-role", lambda: build_request(messages=[("robot", "hi")]), "messages.messages[0].role"),
    ("too-many-stop-strings", lambda: build_request(PROMPT, stop=[f"s{i}" for i in range(17)]), "stopping.stop"),
    ("top-logprobs-21", lambda: build_request(PROMPT, top_logprobs=21), "top_logprobs"),
]


def _expect_invalid(call: Callable[[], object], field: str) -> ProctorError:
    with pytest.raises(ProctorError) as caught:
        call()
    error = caught.value
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT, str(error)
    fields = [name for name, _ in error.field_violations]
    assert field in fields, f"expected a violation of {field!r}, got {error.field_violations}"
    assert all(description for _, description in error.field_violations)
    return error


@pytest.mark.parametrize(("make", "field"), [(make, field) for _, make, field in BAD_REQUESTS],
                         ids=[name for name, _, _ in BAD_REQUESTS])
def test_bad_request_is_invalid_argument_naming_the_field(client: ProctorClient,
                                                          make: Callable[[], pb.GenerateRequest], field: str) -> None:
    request = make()
    _expect_invalid(lambda: client.generate(request), field)


@pytest.mark.parametrize(("make", "field"), [(make, field) for name, make, field in BAD_REQUESTS
                                             if name in {"top-p-zero", "prompt-over-context", "unknown-role"}],
                         ids=["top-p-zero", "prompt-over-context", "unknown-role"])
def test_bad_stream_request_is_invalid_argument_naming_the_field(client: ProctorClient,
                                                                 make: Callable[[], pb.GenerateRequest],
                                                                 field: str) -> None:
    request = make()
    _expect_invalid(lambda: list(client.stream_generate(request)), field)


def test_all_violations_are_reported_together(client: ProctorClient) -> None:
    error = _expect_invalid(lambda: client.generate(PROMPT, temperature=-1, top_p=2.0, top_k=-3), "sampling.top_k")
    fields = {name for name, _ in error.field_violations}
    assert {"sampling.temperature", "sampling.top_p", "sampling.top_k"} <= fields


def test_server_is_healthy_after_bad_requests(client: ProctorClient, server: object,
                                              wait_engine_idle: Callable[[float], bool]) -> None:
    for _, make, field in BAD_REQUESTS:
        request = make()
        _expect_invalid(lambda request=request: client.generate(request), field)
    response = client.generate(PROMPT, temperature=0, max_new_tokens=4)
    assert response.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_EOS)
    assert len(response.token_ids) >= 1
    assert wait_engine_idle(5.0)


# --- inputs that pass validation must never fault the engine ----------------------------------------

@pytest.mark.parametrize("temperature", [1e-38, 1e-40], ids=["tiny", "subnormal"])
def test_tiny_temperature_is_not_an_engine_fault(client: ProctorClient, temperature: float) -> None:
    """A finite temperature > 0 passes validation, so it must sample (effectively greedily), not crash.

    Dividing the logits by ~1e-38 overflows float32 to inf; softmax then yields NaN and
    torch.multinomial raises inside the engine: INTERNAL "engine fault" instead of a result.
    """
    try:
        response = client.generate(PROMPT, temperature=temperature, seed=1, max_new_tokens=4)
    except ProctorError as error:
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT, f"a validated request faulted the engine: {error}"
        assert "sampling.temperature" in [name for name, _ in error.field_violations]
        return
    greedy = client.generate(PROMPT, temperature=0, max_new_tokens=4)
    assert list(response.token_ids) == list(greedy.token_ids)


def test_request_faults_cannot_take_health_to_not_serving(model_dir: object) -> None:
    """Three concurrent requests that each fault the engine must not mark a working server NOT_SERVING.

    Uses its own server: on failure the health status never returns to SERVING.
    """
    import threading

    from proctor.app import BackgroundServer
    from proctor.config import Settings

    background = BackgroundServer(Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False}))
    background.start(timeout_s=300)
    try:
        codes: list[object] = []
        with ProctorClient(background.address, timeout_s=120, retries=0) as isolated:
            def tiny() -> None:
                try:
                    isolated.generate(PROMPT, temperature=1e-38, seed=1, max_new_tokens=2)
                    codes.append("OK")
                except ProctorError as error:
                    codes.append(error.code)

            # Keep the engine busy so that the three queue up and run back to back (consecutive faults).
            busy = isolated.stream_generate(PROMPT, temperature=0, max_new_tokens=24, ignore_eos=True)
            next(busy)
            threads = [threading.Thread(target=tiny) for _ in range(3)]
            for thread in threads:
                thread.start()
            engine = background.running.engine  # type: ignore[union-attr]
            end = time.monotonic() + 10
            while engine.active_count() < 4 and time.monotonic() < end:
                time.sleep(0.005)
            assert list(busy)[-1].finish_reason == pb.FINISH_REASON_LENGTH
            for thread in threads:
                thread.join(120)
            ok = isolated.generate(PROMPT, temperature=0, max_new_tokens=2)
            assert len(ok.token_ids) == 2, "the engine still serves requests"
        time.sleep(0.5)
        with grpc.insecure_channel(background.address) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert status.status == health_pb2.HealthCheckResponse.SERVING, (
            f"health went NOT_SERVING for good after client requests faulted the engine (calls: {codes})")
    finally:
        background.stop()


# --- cancellation and deadlines ----------------------------------------------------------------------

def _assert_quick_follow_up(client: ProctorClient) -> None:
    started = time.monotonic()
    response = client.generate(PROMPT, temperature=0, max_new_tokens=4, ignore_eos=True, timeout_s=30)
    elapsed = time.monotonic() - started
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    assert len(response.token_ids) == 4
    assert elapsed < 10.0, f"a 4-token request took {elapsed:.1f} s after the previous call ended"


def test_cancelled_stream_frees_the_engine(client: ProctorClient, server: object,
                                           wait_engine_idle: Callable[[float], bool]) -> None:
    chunks = client.stream_generate(PROMPT, temperature=0, max_new_tokens=200, ignore_eos=True, timeout_s=120)
    received = [next(chunks), next(chunks)]
    assert all(not c.finish_reason for c in received)
    chunks.close()  # closing the iterator cancels the call
    assert wait_engine_idle(10.0), "the engine still holds the cancelled request"
    _assert_quick_follow_up(client)
    assert wait_engine_idle(5.0)


def test_cancelled_raw_call_frees_the_engine(server: object, wait_engine_idle: Callable[[float], bool]) -> None:
    from proctor_client.v1 import generation_pb2_grpc

    with grpc.insecure_channel(server.address) as channel:  # type: ignore[attr-defined]
        stub = generation_pb2_grpc.GenerationStub(channel)
        call = stub.StreamGenerate(build_request(PROMPT, temperature=0, max_new_tokens=200, ignore_eos=True),
                                   timeout=120)
        next(call)
        next(call)
        call.cancel()
        with pytest.raises(grpc.RpcError) as caught:
            for _ in call:
                pass
        assert caught.value.code() == grpc.StatusCode.CANCELLED
    assert wait_engine_idle(10.0), "the engine still holds the cancelled request"
    with ProctorClient(server.address, timeout_s=60) as fresh:  # type: ignore[attr-defined]
        _assert_quick_follow_up(fresh)


def test_unary_deadline_exceeded_frees_the_engine(client: ProctorClient,
                                                  wait_engine_idle: Callable[[float], bool]) -> None:
    started = time.monotonic()
    with pytest.raises(ProctorError) as caught:
        # Far more tokens than 1 s can produce (q4 makes ~150 a second here), so the deadline always ends it.
        client.generate(PROMPT, temperature=0, max_new_tokens=1500, ignore_eos=True, timeout_s=1.0)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 10.0
    assert wait_engine_idle(10.0), "the engine still holds the expired request"
    _assert_quick_follow_up(client)


def test_stream_deadline_exceeded_frees_the_engine(client: ProctorClient,
                                                   wait_engine_idle: Callable[[float], bool]) -> None:
    received: list[pb.GenerateChunk] = []
    with pytest.raises(ProctorError) as caught:
        for chunk in client.stream_generate(PROMPT, temperature=0, max_new_tokens=1500, ignore_eos=True,
                                            timeout_s=1.5):
            received.append(chunk)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert not any(c.finish_reason for c in received)
    assert wait_engine_idle(10.0), "the engine still holds the expired request"
    _assert_quick_follow_up(client)


# --- health and reflection -------------------------------------------------------------------------

def test_health_check_serving(server: object) -> None:
    with grpc.insecure_channel(server.address) as channel:  # type: ignore[attr-defined]
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", GENERATION_SERVICE):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as caught:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_generation_service(server: object) -> None:
    with grpc.insecure_channel(server.address) as channel:  # type: ignore[attr-defined]
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                 timeout=10))
        assert len(replies) == 1
        names = {s.name for s in replies[0].list_services_response.service}
        assert GENERATION_SERVICE in names
        assert "grpc.health.v1.Health" in names

        symbol = reflection_pb2.ServerReflectionRequest(file_containing_symbol=GENERATION_SERVICE)
        described = list(stub.ServerReflectionInfo(iter([symbol]), timeout=10))
        assert described[0].file_descriptor_response.file_descriptor_proto, "no descriptor for the service"
