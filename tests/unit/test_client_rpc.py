"""The sync and asyncio clients against a real gRPC server on 127.0.0.1 (a fake servicer: the client is under test).

Covers BadRequest decoding into ProctorError.field_violations, retry on UNAVAILABLE only (and for streams only
before the first chunk), deadlines, stream cancellation and readiness polling.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from helpers.grpc_fake import serve_fake, unused_addr

from proctor_client import AsyncProctorClient, ProctorClient, ProctorError, build_request
from proctor_client.v1 import generation_pb2, generation_pb2_grpc

PIECES = ["Hel", "lo", ", wor", "ld"]
FAST = {"backoff_s": 0.01, "timeout_s": 5.0}


class FakeGeneration(generation_pb2_grpc.GenerationServicer):
    """Answers with fixed text; knobs make it fail the first calls, reject requests, or stall."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.requests: list[generation_pb2.GenerateRequest] = []
        self.unavailable_first = 0
        self.bad_request = False
        self.fail_mid_stream = False
        self.stall_s = 0.0
        self.slow_stream = False
        self.cancelled = threading.Event()

    def _enter(self, method: str, context: grpc.ServicerContext) -> None:
        self.calls[method] += 1
        if self.calls[method] <= self.unavailable_first:
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        if self.bad_request:
            context.abort_with_status(rpc_status.to_status(bad_request_status()))
        if self.stall_s:
            time.sleep(self.stall_s)

    def Generate(self, request, context):
        self.requests.append(request)
        self._enter("Generate", context)
        return generation_pb2.GenerateResponse(
            request_id=request.request_id or "srv-1",
            text="".join(PIECES),
            finish_reason=generation_pb2.FINISH_REASON_EOS,
            usage=generation_pb2.Usage(prompt_tokens=3, completion_tokens=4),
        )

    def StreamGenerate(self, request, context):
        self.requests.append(request)
        self._enter("StreamGenerate", context)
        if self.slow_stream:
            context.add_callback(self.cancelled.set)
            for i in range(200):
                yield generation_pb2.GenerateChunk(text=f"{i} ")
                time.sleep(0.02)
            return
        for i, piece in enumerate(PIECES):
            if self.fail_mid_stream and i == 2:
                context.abort(grpc.StatusCode.UNAVAILABLE, "connection dropped")
            yield generation_pb2.GenerateChunk(text=piece, token_ids=[i])
        yield generation_pb2.GenerateChunk(
            finish_reason=generation_pb2.FINISH_REASON_EOS,
            usage=generation_pb2.Usage(prompt_tokens=3, completion_tokens=4),
        )

    def GetModelInfo(self, request, context):
        self._enter("GetModelInfo", context)
        return generation_pb2.ModelInfo(model_id="fake/model", context_length_tokens=2048, eos_token_ids=[2])


def bad_request_status() -> status_pb2.Status:
    detail = any_pb2.Any()
    detail.Pack(
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field="sampling.top_p", description="must be in (0, 1]"),
                error_details_pb2.BadRequest.FieldViolation(field="stopping.max_new_tokens", description="must be > 0"),
            ]
        )
    )
    return status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="invalid request", details=[detail])


@pytest.fixture
def fake() -> Iterator[tuple[FakeGeneration, str]]:
    servicer = FakeGeneration()
    with serve_fake(servicer) as addr:
        yield servicer, addr


# --- sync client -------------------------------------------------------------------------------------------


def test_generate_sends_request_and_returns_response(fake) -> None:
    servicer, addr = fake
    with ProctorClient(addr, **FAST) as client:
        response = client.generate("hi", temperature=0.0, max_new_tokens=8)
    assert response.text == "Hello, world"
    assert response.finish_reason == generation_pb2.FINISH_REASON_EOS
    sent = servicer.requests[0]
    assert sent.prompt == "hi" and sent.sampling.HasField("temperature") and sent.stopping.max_new_tokens == 8


def test_generate_accepts_prebuilt_request_and_messages(fake) -> None:
    servicer, addr = fake
    with ProctorClient(addr, **FAST) as client:
        client.generate(build_request("x", request_id="mine"))
        client.generate(messages=[("user", "hi")])
    assert servicer.requests[0].request_id == "mine"
    assert servicer.requests[1].messages.messages[0].content == "hi"


def test_bad_request_field_violations_and_no_retry(fake) -> None:
    servicer, addr = fake
    servicer.bad_request = True
    with ProctorClient(addr, **FAST) as client, pytest.raises(ProctorError) as caught:
        client.generate("hi", top_p=1.5)
    error = caught.value
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.message == "invalid request"
    assert error.field_violations == [
        ("sampling.top_p", "must be in (0, 1]"),
        ("stopping.max_new_tokens", "must be > 0"),
    ]
    assert servicer.calls["Generate"] == 1


def test_from_rpc_error_without_details(fake) -> None:
    servicer, addr = fake
    servicer.unavailable_first = 1
    with grpc.insecure_channel(addr) as channel, pytest.raises(grpc.RpcError) as caught:
        generation_pb2_grpc.GenerationStub(channel).Generate(build_request("hi"), timeout=5)
    error = ProctorError.from_rpc_error(caught.value)
    assert (error.code, error.message, error.field_violations) == (grpc.StatusCode.UNAVAILABLE, "warming up", [])


def test_unary_retries_unavailable_then_succeeds(fake) -> None:
    servicer, addr = fake
    servicer.unavailable_first = 2
    with ProctorClient(addr, retries=3, **FAST) as client:
        assert client.generate("hi").text == "Hello, world"
        assert client.model_info().model_id == "fake/model"
    assert servicer.calls["Generate"] == 3
    assert servicer.calls["GetModelInfo"] == 3


def test_unary_gives_up_after_retries(fake) -> None:
    servicer, addr = fake
    servicer.unavailable_first = 10
    with ProctorClient(addr, retries=2, **FAST) as client, pytest.raises(ProctorError) as caught:
        client.generate("hi")
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert servicer.calls["Generate"] == 3


def test_deadline_exceeded_is_not_retried(fake) -> None:
    servicer, addr = fake
    servicer.stall_s = 0.5
    with ProctorClient(addr, backoff_s=0.01, timeout_s=0.1) as client, pytest.raises(ProctorError) as caught:
        client.generate("hi")
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert servicer.calls["Generate"] == 1


def test_per_call_timeout_overrides_default(fake) -> None:
    servicer, addr = fake
    servicer.stall_s = 0.3
    with ProctorClient(addr, timeout_s=0.05) as client:
        assert client.generate("hi", timeout_s=5.0).text == "Hello, world"
        assert client.generate("hi", timeout_s=None).text == "Hello, world"


def test_sync_stream_yields_chunks(fake) -> None:
    _, addr = fake
    with ProctorClient(addr, **FAST) as client:
        chunks = list(client.stream_generate("hi"))
    assert "".join(c.text for c in chunks) == "Hello, world"
    assert chunks[-1].finish_reason == generation_pb2.FINISH_REASON_EOS
    assert chunks[-1].usage.completion_tokens == 4


def test_sync_stream_retries_before_first_chunk(fake) -> None:
    servicer, addr = fake
    servicer.unavailable_first = 1
    with ProctorClient(addr, **FAST) as client:
        assert "".join(c.text for c in client.stream_generate("hi")) == "Hello, world"
    assert servicer.calls["StreamGenerate"] == 2


def test_sync_stream_does_not_retry_after_a_chunk(fake) -> None:
    servicer, addr = fake
    servicer.fail_mid_stream = True
    received: list[str] = []
    with ProctorClient(addr, **FAST) as client, pytest.raises(ProctorError) as caught:
        received.extend(chunk.text for chunk in client.stream_generate("hi"))
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert received == PIECES[:2]
    assert servicer.calls["StreamGenerate"] == 1


def test_sync_stream_validates_eagerly_and_cancels_on_break(fake) -> None:
    servicer, addr = fake
    servicer.slow_stream = True
    with ProctorClient(addr, **FAST) as client:
        with pytest.raises(ValueError):
            client.stream_generate()
        stream = client.stream_generate("hi")
        for i, _ in enumerate(stream):
            if i == 1:
                break
        stream.close()  # type: ignore[attr-defined]
        assert servicer.cancelled.wait(5.0)


def test_wait_ready_and_unreachable_server(fake) -> None:
    _, addr = fake
    with ProctorClient(addr, **FAST) as client:
        assert client.wait_ready(5.0).model_id == "fake/model"
    started = time.monotonic()
    with ProctorClient(unused_addr(), **FAST) as client, pytest.raises(ProctorError) as caught:
        client.wait_ready(0.6)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 5.0


def test_wait_ready_polls_through_unavailable(fake) -> None:
    servicer, addr = fake
    servicer.unavailable_first = 2
    with ProctorClient(addr, retries=0, **FAST) as client:
        assert client.wait_ready(5.0).model_id == "fake/model"
    assert servicer.calls["GetModelInfo"] == 3


# --- asyncio client ----------------------------------------------------------------------------------------


def test_async_generate_stream_and_info(fake) -> None:
    servicer, addr = fake
    servicer.unavailable_first = 1

    async def scenario() -> tuple[str, str, str, list[generation_pb2.GenerateChunk]]:
        async with AsyncProctorClient(addr, **FAST) as client:
            info = await client.wait_ready(5.0)
            response = await client.generate("hi", seed=3)
            chunks = [chunk async for chunk in client.stream_generate(messages=[{"role": "user", "content": "hi"}])]
            return info.model_id, response.text, "".join(c.text for c in chunks), chunks

    model_id, text, streamed, chunks = asyncio.run(scenario())
    assert (model_id, text, streamed) == ("fake/model", "Hello, world", "Hello, world")
    assert chunks[-1].finish_reason == generation_pb2.FINISH_REASON_EOS
    assert servicer.calls["Generate"] == 2  # first attempt UNAVAILABLE, retried
    assert servicer.calls["StreamGenerate"] == 2


def test_async_bad_request_and_mid_stream_failure(fake) -> None:
    servicer, addr = fake

    async def scenario() -> tuple[ProctorError, ProctorError, list[str]]:
        async with AsyncProctorClient(addr, **FAST) as client:
            servicer.bad_request = True
            try:
                await client.generate("hi")
            except ProctorError as error:
                bad = error
            servicer.bad_request = False
            servicer.fail_mid_stream = True
            received: list[str] = []
            try:
                async for chunk in client.stream_generate("hi"):
                    received.append(chunk.text)
            except ProctorError as error:
                dropped = error
            return bad, dropped, received

    bad, dropped, received = asyncio.run(scenario())
    assert bad.code == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.field_violations[0] == ("sampling.top_p", "must be in (0, 1]")
    assert dropped.code == grpc.StatusCode.UNAVAILABLE
    assert received == PIECES[:2]
    assert servicer.calls["Generate"] == 1
    assert servicer.calls["StreamGenerate"] == 1


def test_async_unreachable_gives_up() -> None:
    async def scenario() -> ProctorError:
        async with AsyncProctorClient(unused_addr(), retries=1, backoff_s=0.01, timeout_s=5.0) as client:
            try:
                await client.model_info()
            except ProctorError as error:
                return error
            raise AssertionError("expected a ProctorError")

    assert asyncio.run(scenario()).code == grpc.StatusCode.UNAVAILABLE
